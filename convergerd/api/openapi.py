"""The HTTP API as an OpenAPI 3 document (plain data), served at `GET /openapi.json`.

Kept true by `tests/integration/test_openapi.py`: every route of the app is documented and
every documented route is served, and every documented (path, method, answer) is produced.
"""

from __future__ import annotations

from typing import Any

from convergerd import __version__
from convergerd.api.scopes import ROUTE_SCOPES, Scope
from convergerd.core.gates import Command, Gate
from convergerd.core.model import ENFORCEMENTS, POLICY_ID_MAX_LEN
from convergerd.core.report import FanoutResult, FanoutStatus
from convergerd.core.revisions import KEYS_LISTED, PAGE_DEFAULT, PAGE_MAX, Kind
from convergerd.core.revisions import Operation as RevisionOperation
from convergerd.core.rollout import OnHalt, State
from convergerd.core.rows import BOUNDARY_POLICIES_LISTED
from convergerd.core.save import Operation, SaveAction
from convergerd.core.tokens import BY_MAX_CHARS, NAME_MAX_CHARS
from convergerd.status.listing import FLEET_COUNTS, UNSUPPORTED_LISTED, WORST_LISTED
from convergerd.status.rollouts import CLUSTERS_NAMED

JSON = "application/json"
# The id patterns the handlers check (`model.check_policy_id`, `model.check_cluster_id`).
_DNS_LABEL = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"

_NULLABLE_STRING: dict[str, Any] = {"type": "string", "nullable": True}
_NULLABLE_TIME: dict[str, Any] = {"type": "string", "format": "date-time", "nullable": True}
_ENFORCEMENT: dict[str, Any] = {
    "type": "string", "enum": list(ENFORCEMENTS),
    "description": "what admission does with a request the rule fails: the binding's "
                   "validationActions [Deny], [Warn, Audit] or [Audit]"}


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _answer(description: str, schema: str = "Error") -> dict[str, Any]:
    return {"description": description, "content": {JSON: {"schema": _ref(schema)}}}


def _id(kind: str, max_length: int) -> dict[str, Any]:
    return {"name": "id", "in": "path", "required": True,
            "description": f"the {kind} id (a DNS label of at most {max_length} characters)",
            "schema": {"type": "string", "pattern": _DNS_LABEL, "maxLength": max_length}}


_POLICY_ID = _id("policy", POLICY_ID_MAX_LEN)
_CLUSTER_ID = _id("cluster", 63)

_MODE_COUNTS = {"type": "object", "additionalProperties": {"type": "integer"},
                "description": "per mode of the binding in force: Deny, Warn, Audit (other: a "
                               "mode this version does not know)"}
_FIGURES = {"denied": {"type": "integer", "minimum": 0},
            "warned": {"type": "integer", "minimum": 0},
            "audited": {"type": "integer", "minimum": 0}}
_NULLABLE_FIGURES = {k: {**v, "nullable": True} for k, v in _FIGURES.items()}
_ADMISSION_SCHEMAS: dict[str, Any] = {
    "Admission": {
        "type": "object", "nullable": True,
        "description": "`status.admission` as the operator wrote it (null: none): the API "
                       "server's counts of failed validations of the policy, by what "
                       "admission did, since `revision` was installed (`since`) and over the "
                       "hour before `read_at`",
        "properties": {
            **_NULLABLE_FIGURES,
            "last_hour": {"type": "object", "properties": _NULLABLE_FIGURES},
            "revision": {"type": "integer", "nullable": True,
                         "description": "the revision whose installation the counts start at"},
            "since": _NULLABLE_TIME, "read_at": _NULLABLE_TIME,
            "stale": {"type": "boolean",
                      "description": "read_at is older than five of the operators' probe "
                                     "periods (the operator rewrites unchanged counts every "
                                     "three): counting stopped"},
            "resets": {"type": "integer", "nullable": True,
                       "description": "API server counters that started again (restarts): "
                                      "the counts are a lower bound"},
            "note": {**_NULLABLE_STRING, "description": "what the counts cannot say"},
            "problem": {**_NULLABLE_STRING,
                        "description": "why the counts cannot be read (they are null); the "
                                       "phase is unaffected"}},
    },
    "ClusterAdmission": {
        "type": "object", "nullable": True,
        "description": "admission's counts on the cluster summed over its policies (null: "
                       "none read there)",
        "properties": {**_FIGURES, "last_hour": {"type": "object", "properties": _FIGURES},
                       "policies_counted": {"type": "integer"},
                       "unknown": {"type": "integer",
                                   "description": "policies whose counts cannot be read"},
                       "excepted": {"type": "integer", "nullable": True}},
    },
    "PolicyAdmission": {
        "type": "object",
        "description": "what admission did with the policy over its clusters (per cluster: "
                       "`admission`, `enforcement_action`): the counts summed over the "
                       "clusters that can say them, each since its installed revision",
        "properties": {
            **_FIGURES, "last_hour": {"type": "object", "properties": _FIGURES},
            "clusters_counted": {"type": "integer"},
            "clusters_unknown": {"type": "integer",
                                 "description": "clusters whose counts cannot be read"},
            "clusters_stale": {"type": "integer"},
            "clusters_with_resets": {"type": "integer"},
            "clusters_by_enforcement": {
                **_MODE_COUNTS,
                "description": "clusters per mode of the policy's binding in force: a policy "
                               "saved as Deny and still Warn somewhere shows here"}},
    },
    "FleetAdmission": {
        "type": "object",
        "description": "admission over the fleet, and per policy its totals: the policies "
                       "admission counted, or in force in a mode other than Deny somewhere "
                       "(the most denied, warned, audited first; at most 100 listed)",
        "properties": {
            **_FIGURES, "last_hour": {"type": "object", "properties": _FIGURES},
            "policies_total": {"type": "integer"},
            "policies": {"type": "array", "items": {
                "type": "object", "properties": {
                    "id": {"type": "string"}, **_FIGURES,
                    "last_hour": {"type": "object", "properties": _FIGURES},
                    "clusters_by_enforcement": _MODE_COUNTS,
                    "excepted": {"type": "integer", "nullable": True}}}}},
    },
}

_SCHEMAS: dict[str, Any] = {
    "LiveRollout": {"type": "object", "properties": {
        "policy": {"type": "string"}, "id": {"type": "integer"},
        "to_revision": {"type": "integer"},
        "from_revision": {"type": "integer", "nullable": True},
        "strategy": {"type": "string"}, "state": {"type": "string"},
        "wave": {"type": "object", "properties": {
            "index": {"type": "integer"}, "name": {"type": "string"},
            "of": {"type": "integer"}, "warn_step": {"type": "boolean"}}},
        "gate": _NULLABLE_STRING, "reason": _NULLABLE_STRING,
        "since": _NULLABLE_TIME,
        "clusters": {"type": "object", "properties": {
            "new": {"type": "integer"}, "old": {"type": "integer"}}}}},
    "Error": {
        "type": "object", "required": ["error"], "additionalProperties": True,
        "properties": {"error": {"type": "string", "description": "what went wrong"},
                       "reason": {"type": "string", "description": "a slug, e.g. `database`"}},
    },
    "Health": {
        "type": "object", "required": ["ok", "loop_lag_seconds"],
        "properties": {"ok": {"type": "boolean"}, "loop_lag_seconds": {"type": "number"}},
    },
    "Ready": {"type": "object", "required": ["ready"],
              "properties": {"ready": {"type": "boolean"}}},
    "Unhealthy": {
        "type": "object", "required": ["error", "problems"],
        "properties": {"error": {"type": "string"},
                       "problems": {"type": "array", "items": {"type": "string"}}},
    },
    "Database": {
        "type": "object",
        "properties": {"reachable": {"type": "boolean"}, "error": _NULLABLE_STRING,
                       "url": {"type": "string", "description": "password redacted"},
                       "synced_at": _NULLABLE_TIME},
    },
    "ClusterSummary": {
        "type": "object", "additionalProperties": True,
        "properties": {
            "id": {"type": "string"}, "reachable": {"type": "boolean", "nullable": True},
            "checked_at": _NULLABLE_TIME, "lag_seconds": {"type": "number"},
            "last_success_at": _NULLABLE_TIME, "last_attempt_at": _NULLABLE_TIME,
            "desired": {"type": "integer"}, "in_sync": {"type": "integer"},
            "failed": {"type": "integer"},
            "phases": {"type": "object", "additionalProperties": {"type": "integer"}},
            "verification": {
                "type": "object", "additionalProperties": {"type": "integer"},
                "description": "policies by the operator's enforcement probe: verified, "
                               "admitted (NOT enforced), not_verified (including a "
                               "condition no probe accounts for), stale (the last probe is "
                               "older than verified_stale_after_seconds), unknown"},
            "last_error": _NULLABLE_STRING, "last_reason": _NULLABLE_STRING,
            "server_version": _NULLABLE_STRING,
            "audit": _ref("ClusterAudit"),
            "enforcement": {**_MODE_COUNTS,
                            "description": "its policies per mode of the binding in force "
                                           "(`status.enforcementAction`), beside `phases`"},
            "admission": _ref("ClusterAdmission"),
            "shard": {"type": "integer", "description": "its shard (0 with one shard)"},
            "holder": {**_NULLABLE_STRING,
                       "description": "the replica holding its shard's Lease, as this "
                                      "replica sees it; null when free or expired"},
            "orphaned": {"type": "boolean",
                         "description": "no finished round for more than two intervals"},
        },
    },
    "ClusterAudit": {
        "type": "object", "nullable": True,
        "description": "the operator's audit of what already runs on the cluster, summed over "
                       "its policies (null: no audit read there)",
        "properties": {
            "violations": {"type": "integer", "minimum": 0,
                           "description": "existing objects the policies would deny (audits "
                                          "that cannot be read count nothing)"},
            "policies_with_violations": {"type": "integer"},
            "policies_audited": {"type": "integer"},
            "unknown": {"type": "integer", "description": "audits that cannot be read"},
            "unsynced": {"type": "boolean",
                         "description": "some audit is not current: the operator's cache not "
                                        "synced, unreadable, or stale"}},
    },
    "Audit": {
        "type": "object", "nullable": True,
        "description": "`status.audit` as the operator wrote it (null: none): existing objects "
                       "in the boundary's namespaces that the policy would deny",
        "properties": {
            "violations": {"type": "integer", "minimum": 0, "maximum": 1000000000,
                           "nullable": True,
                           "description": "null: the audit cannot be read or believed "
                                          "(`problem` says why)"},
            "audited_at": _NULLABLE_TIME,
            "cache_synced": {"type": "boolean", "nullable": True},
            "excepted": {"type": "integer", "minimum": 0, "nullable": True,
                         "description": "`status.audit.excepted`: existing objects the rule "
                                        "would deny that an exception admits, counted apart "
                                        "(null: not said, as while no exception is in "
                                        "force)"},
            "state": {"type": "string", "enum": ["current", "unsynced", "stale", "unknown"],
                      "description": "stale: the reading is stale, or the audit is older "
                                     "than five of the operators' probe periods (the "
                                     "operator rewrites an unchanged audit's time every "
                                     "three)"},
            "problem": _NULLABLE_STRING},
    },
    "AuditSample": {
        "type": "object",
        "properties": {"cluster": {"type": "string"}, "kind": {"type": "string"},
                       "namespace": _NULLABLE_STRING, "name": {"type": "string"},
                       "message": _NULLABLE_STRING},
    },
    "Status": {
        "type": "object", "additionalProperties": True,
        "required": ["identity", "leader", "clusters", "version", "database"],
        "properties": {
            "identity": {"type": "string"}, "version": {"type": "string"},
            "now": {"type": "string", "format": "date-time",
                    "description": "when this body's build began: a body is served to many "
                                   "requests, at most max(1 s, 10 times its build's time) "
                                   "old (see docs/design.md, Endpoints)"},
            "leader": {"type": "object", "properties": {
                "is_leader": {"type": "boolean"}, "holder": _NULLABLE_STRING,
                "since": _NULLABLE_TIME}},
            "interval_seconds": {"type": "number"}, "stale_after_seconds": {"type": "number"},
            "verified_stale_after_seconds": {"type": "number"},
            "last_round": {"type": "object", "nullable": True, "additionalProperties": True},
            "next_round_at": _NULLABLE_TIME,
            "invalid_policies": {"type": "array", "items": {
                "type": "object", "properties": {"id": {"type": "string"},
                                                 "reason": {"type": "string"}}}},
            "rollouts": {
                "type": "array", "description": "each live rollout, as of the last database "
                "sync: its wave, state, the gate that holds it, clusters reporting its new "
                "revision and another one (`GET /v1/policies/{id}/rollout` for more)",
                "items": _ref("LiveRollout")},
            "pending_deletions": {
                "type": "object",
                "description": "deletions some cluster did not confirm (oldest first, at most "
                               "100 listed): the policy is still enforced where held",
                "properties": {
                    "count": {"type": "integer"},
                    "oldest_first": {"type": "array", "items": {
                        "type": "object", "properties": {
                            "id": {"type": "string"},
                            "requested_at": {"type": "string", "format": "date-time"},
                            "pending_seconds": {"type": "number"},
                            "clusters_holding": {"type": "integer"},
                            "held_by": {"type": "array", "items": {"type": "string"},
                                        "description": "the first five, by id"}}}}}},
            "clusters": {"type": "array", "items": _ref("ClusterSummary"),
                         "description": "worst first: every cluster, or past "
                                        "CONVERGERD_STATUS_MAX_CLUSTERS (default 1000) the "
                                        f"worst {WORST_LISTED}; on a page, the page's clusters "
                                        "by id (see `listing`)"},
            "fleet": {
                "type": "object",
                "description": "counts over every cluster, listed or not: unreached "
                               "(reachable false), unchecked (never probed), failing (reached, "
                               "with an error or a failed policy), lagging (lag over "
                               "stale_after_seconds), in_sync (reached, nothing failing, every "
                               "desired policy in sync), unsupported, orphaned",
                "properties": {k: {"type": "integer"} for k in FLEET_COUNTS}},
            "listing": {
                "type": "object",
                "description": "which clusters `clusters` lists and where the rest are",
                "properties": {
                    "complete": {"type": "boolean",
                                 "description": "every cluster is in `clusters`"},
                    "order": {"type": "string", "enum": ["worst_first", "id"]},
                    "listed": {"type": "integer"},
                    "after": {**_NULLABLE_STRING,
                              "description": "the page's `after` (null: not a page, or "
                                             "the first)"},
                    "next": {**_NULLABLE_STRING,
                             "description": "the relative URL of the next page (a summary: "
                                            "the first page); null: nothing follows"}}},
            "unsupported_by_version": {
                "type": "object",
                "description": "Unsupported clusters by Kubernetes version; past "
                               "CONVERGERD_STATUS_MAX_CLUSTERS at most "
                               f"{UNSUPPORTED_LISTED} named in all (`fleet.unsupported` "
                               "counts them)",
                "additionalProperties": {"type": "array", "items": {"type": "string"}}},
            "admission": _ref("FleetAdmission"),
            "audit": {
                "type": "object",
                "description": "the operators' audits over the fleet, and the policies whose "
                               "audits count violations (worst first, at most 100 listed)",
                "properties": {
                    "violations": {"type": "integer"}, "clusters_audited": {"type": "integer"},
                    "clusters_with_violations": {"type": "integer"},
                    "unsynced_clusters": {"type": "integer"},
                    "policies_with_violations": {"type": "integer"},
                    "policies": {"type": "array", "items": {
                        "type": "object", "properties": {
                            "id": {"type": "string"}, "violations": {"type": "integer"},
                            "clusters": {"type": "integer"}}}}}},
            "database": _ref("Database"),
            "shards": {
                "type": "object",
                "description": "CONVERGERD_SHARDS: who holds which shard (from the Leases) and "
                               "each shard's last round and orphans (from the database)",
                "properties": {
                    "count": {"type": "integer"},
                    "held_here": {"type": "array", "items": {"type": "integer"}},
                    "members": {"type": "array", "items": {"type": "string"}},
                    "share": {"type": "integer", "nullable": True},
                    "orphan_clusters": {"type": "integer"},
                    "shards": {"type": "array", "items": {
                        "type": "object", "properties": {
                            "shard": {"type": "integer"}, "holder": _NULLABLE_STRING,
                            "clusters": {"type": "integer"},
                            "orphan_clusters": {"type": "integer"},
                            "last_round_at": _NULLABLE_TIME}}}}},
        },
    },
    "PolicyRecord": {
        "type": "object", "additionalProperties": True,
        "description": "one policy on one cluster: delivery, last error, phase",
        "properties": {
            "delivered_revision": {"type": "integer", "nullable": True},
            "last_result": _NULLABLE_STRING, "last_attempt_at": _NULLABLE_TIME,
            "last_success_at": _NULLABLE_TIME, "last_error": _NULLABLE_STRING,
            "last_reason": _NULLABLE_STRING, "in_sync": {"type": "boolean"},
            "verified": {
                "type": "object", "nullable": True,
                "description": "the Verified condition the operator's enforcement probe wrote",
                "properties": {"status": {"type": "string", "enum": ["True", "False", "Unknown"]},
                               "reason": _NULLABLE_STRING, "message": _NULLABLE_STRING,
                               "probed_at": _NULLABLE_TIME, "since": _NULLABLE_TIME,
                               "verification": {"type": "string", "enum": [
                                   "verified", "admitted", "not_verified", "stale",
                                   "unknown"]},
                               "stale": {"type": "boolean",
                                         "description": "the probe is older than two of "
                                                        "the operators' probe periods"},
                               "untrusted": {**_NULLABLE_STRING,
                                             "description": "why the condition is not "
                                                            "believed (a lastProbeTime in "
                                                            "the future)"}}},
            "audit": _ref("Audit"),
            "enforcement_action": {
                **_NULLABLE_STRING,
                "description": "`status.enforcementAction`: the mode of the binding in force "
                               "(Deny, Warn, Audit) beside the phase; null: no binding (Inert) "
                               "or none said"},
            "admission": _ref("Admission"),
        },
    },
    "ClusterView": {
        "type": "object", "required": ["cluster", "policies", "database"],
        "properties": {
            "cluster": _ref("ClusterSummary"),
            "policies": {"type": "array", "items": {"allOf": [_ref("PolicyRecord"), {
                "type": "object", "properties": {
                    "id": {"type": "string"},
                    "in_database": {"type": "boolean", "nullable": True},
                    "current_revision": {"type": "integer", "nullable": True}}}]}},
            "database": _ref("Database"),
        },
    },
    "PolicyView": {
        "type": "object", "required": ["policy", "clusters"],
        "properties": {
            "policy": {"type": "object", "properties": {
                "id": {"type": "string"}, "boundary": {"type": "string"},
                "revision": {"type": "integer"}, "enabled": {"type": "boolean"},
                "enforcement": _ENFORCEMENT,
                "rule_type": _NULLABLE_STRING, "delivered_to_clusters": {"type": "boolean"},
                "invalid": _NULLABLE_STRING,
                "deletion": {
                    "type": "object", "nullable": True,
                    "description": "its deletion began and some cluster did not confirm it "
                                   "(null: not being deleted); a retry of the DELETE finishes",
                    "properties": {
                        "requested_at": {"type": "string", "format": "date-time"},
                        "pending_seconds": {"type": "number"},
                        "held_by": {"type": "array", "items": {"type": "string"},
                                    "description": "clusters still recorded as holding it"}}}}},
            "audit": {
                "type": "object",
                "description": "the policy's audits over its clusters (per cluster: `audit`)",
                "properties": {
                    "violations": {"type": "integer",
                                   "description": "the total of the counts that can be read"},
                    "clusters_audited": {"type": "integer"},
                    "clusters_with_violations": {"type": "integer"},
                    "clusters_unknown": {"type": "integer"},
                    "clusters_not_current": {"type": "integer"},
                    "sample": {"type": "array", "maxItems": 5, "items": _ref("AuditSample"),
                               "description": "at most five, from clusters still counting "
                                              "violations (the cluster read last first)"},
                    "excepted": {"type": "integer", "nullable": True,
                                 "description": "the audits' excepted objects summed (null: "
                                                "no audit says any)"}}},
            "admission": _ref("PolicyAdmission"),
            "clusters": {"type": "array", "items": {"allOf": [_ref("PolicyRecord"), {
                "type": "object", "properties": {
                    "cluster": {"type": "string"}, "in_scope": {"type": "boolean"},
                    "current_revision": {"type": "integer"},
                    "cluster_reachable": {"type": "boolean", "nullable": True}}}]}},
        },
    },
    "ClusterResult": {
        "type": "object", "required": ["cluster", "action", "result"],
        "properties": {
            "cluster": {"type": "string"},
            "action": {"type": "string", "enum": [a.value for a in SaveAction]},
            "result": {"type": "string", "enum": [r.value for r in FanoutResult],
                       "description": "`pending`: no answer yet when the save answered (a "
                       "hung cluster); written until the save's deadline, the result "
                       "recorded"},
            "reason": _NULLABLE_STRING, "error": _NULLABLE_STRING,
        },
    },
    "Report": {
        "type": "object", "required": ["operation", "policy", "status", "clusters"],
        "properties": {
            "operation": {"type": "string", "enum": [o.value for o in Operation]},
            "policy": {"type": "string"},
            "status": {"type": "string", "enum": [s.value for s in FanoutStatus]},
            "revision": {"type": "integer", "nullable": True},
            "clusters": {"type": "array", "items": _ref("ClusterResult")},
            "skipped_reason": _NULLABLE_STRING,
            "error": {"type": "string", "description": "present when refused"},
            "enforcement": {**_ENFORCEMENT,
                            "description": "the mode this save stored (present when the "
                                           "request asked for one)"},
            "rollout": {
                "type": "object",
                "description": "present when the policy has a rollout strategy: the rollout "
                               "this save started or follows; only its due clusters were "
                               "written, the others keep their revision",
                "properties": {
                    "id": {"type": "integer"}, "state": {"type": "string"},
                    "wave": {"type": "integer"}, "wave_name": {"type": "string"},
                    "started": {"type": "boolean"}, "strategy": {"type": "string"},
                    "clusters_written": {"type": "integer"},
                    "clusters_in_scope": {"type": "integer"},
                },
            },
        },
    },
    "Exception": {
        "type": "object", "required": ["namespace", "reason", "requestedBy", "approvedBy",
                                       "expiresAt"],
        "description": "an exception to a policy, as the Policy CR's spec.exceptions carries "
                       "it: the objects of `namespace` (all, the one named `name`, or those "
                       "whose labels carry every pair of `selector.matchLabels`) are admitted "
                       "until `expiresAt`; `name` and `selector` exclude each other",
        "properties": {
            "id": {"type": "string", "pattern": _DNS_LABEL, "maxLength": 40,
                   "description": "chosen by the daemon when a grant has none"},
            "namespace": {"type": "string", "pattern": _DNS_LABEL, "maxLength": 63},
            "name": {"type": "string", "maxLength": 253},
            "selector": {"type": "object", "required": ["matchLabels"], "properties": {
                "matchLabels": {"type": "object",
                                "additionalProperties": {"type": "string"}}}},
            "reason": {"type": "string", "maxLength": 512},
            "requestedBy": {"type": "string", "maxLength": 128},
            "approvedBy": {"type": "string", "maxLength": 128},
            "expiresAt": {"type": "string", "description": "ISO 8601: a date (00:00 UTC) or "
                          "a time with its zone; in the future, at most "
                          "CONVERGERD_EXCEPTION_MAX_DAYS (default 90) days away"}}},
    "Exceptions": {
        "type": "object", "required": ["exceptions"], "properties": {"exceptions": {
            "type": "array", "description": "soonest expiry first, at most 1000",
            "items": {"allOf": [_ref("Exception"), {"type": "object", "properties": {
                "policy": {"type": "string"},
                "state": {"type": "string", "enum": ["active", "expired"]},
                "grantedAt": {"type": "string", "format": "date-time"},
                "grantedRevision": {"type": "integer"},
                "lapsedRevision": {"type": "integer", "nullable": True}}}]}}}},
    "ExceptionChange": {
        "type": "object", "required": ["policy", "revision", "save"],
        "description": "the change stored (a new revision of the policy), then saved to its "
                       "clusters at once",
        "properties": {
            "policy": {"type": "string"},
            "granted": _ref("Exception"), "withdrawn": _ref("Exception"),
            "revision": {"type": "integer"},
            "save": {"type": "object", "description": "the save's answer (as POST "
                     "/v1/policies/{id}/apply answers), or `status: failed` with `error` "
                     "when the database went away after the change"}}},
    "WithdrawRequest": {
        "type": "object", "additionalProperties": False, "required": ["by"],
        "properties": {"by": {"type": "string", "maxLength": 128,
                              "description": "who withdraws it (recorded)"}}},
    "DeleteRequest": {
        "type": "object", "additionalProperties": False, "properties": {},
        "description": "no fields: an empty object, or no body at all"},
    "SaveRequest": {
        "type": "object", "additionalProperties": False,
        "properties": {
            "allow_mass_removal": {
                "type": "boolean", "default": False,
                "description": "remove from clusters that left the scope even past the guard"},
            "enforcement": {
                **_ENFORCEMENT,
                "description": "store this mode first (a change is a new revision), then save: "
                               "Deny rejects what fails the rule, Warn admits it with a "
                               "warning, Audit admits it and records it in the API server's "
                               "audit log; absent: the stored mode is kept"}},
    },
}

_COUNTS = {"type": "object", "additionalProperties": {"type": "integer"}}
_SCHEMAS.update(_ADMISSION_SCHEMAS)
_SCHEMAS.update({
    "TokenRequest": {
        "type": "object", "additionalProperties": False, "required": ["boundary", "name"],
        "properties": {
            "boundary": {"type": "string", "maxLength": 63,
                         "description": "the boundary the token reads (it must exist)"},
            "name": {"type": "string", "pattern": _DNS_LABEL, "maxLength": NAME_MAX_CHARS,
                     "description": "unique among the tokens not revoked"},
            "expires_at": {"type": "string", "description": "ISO 8601: a date (the token "
                           "stops working when that day begins, UTC) or a time with its "
                           "offset; in the future. Absent: it does not expire"},
            "by": {"type": "string", "maxLength": BY_MAX_CHARS,
                   "description": "who asks, recorded (default: `admin token`)"}},
    },
    "RevokeRequest": {
        "type": "object", "additionalProperties": False,
        "properties": {"by": {"type": "string", "maxLength": BY_MAX_CHARS,
                              "description": "who asks, recorded"}},
    },
    "Token": {
        "type": "object",
        "required": ["name", "boundary", "created_by", "created_at", "expires_at", "expired",
                     "revoked_by", "revoked_at"],
        "properties": {
            "name": {"type": "string"}, "boundary": {"type": "string"},
            "created_by": {"type": "string"}, "created_at": {"type": "string",
                                                             "format": "date-time"},
            "expires_at": _NULLABLE_TIME, "expired": {"type": "boolean"},
            "revoked_by": _NULLABLE_STRING, "revoked_at": _NULLABLE_TIME},
    },
    "TokenCreated": {"allOf": [_ref("Token"), {
        "type": "object", "required": ["token"],
        "properties": {"token": {"type": "string", "description": "the token, shown this "
                                 "once: only its SHA-256 is kept"}}}]},
    "TokenList": {"type": "object", "required": ["tokens"],
                  "properties": {"tokens": {"type": "array", "items": _ref("Token")}}},
    "TokenRevoked": {"type": "object", "required": ["revoked"],
                     "properties": {"revoked": _ref("Token")}},
    "BoundaryCounts": {
        "type": "object", "required": ["phases", "verification", "in_sync", "failed",
                                       "violations"],
        "properties": {"phases": _COUNTS, "verification": _COUNTS,
                       "in_sync": {"type": "integer"}, "failed": {"type": "integer"},
                       "violations": {"type": "integer"},
                       "enforcement": {**_MODE_COUNTS, "description": "readings per mode "
                                       "of the binding in force, beside `phases`"},
                       "admission": {
                           "type": "object", "nullable": True,
                           "description": "admission's counts summed over the readings that "
                                          "can say them (null: none), each since its "
                                          "cluster's revision",
                           "properties": {**_FIGURES, "last_hour": {
                               "type": "object", "properties": _FIGURES}}}},
    },
    "BoundaryCluster": {"allOf": [_ref("BoundaryCounts"), {
        "type": "object",
        "required": ["id", "reachable", "checked_at", "lag_seconds", "last_success_at",
                     "server_version", "failure"],
        "properties": {
            "id": {"type": "string"}, "reachable": {"type": "boolean", "nullable": True},
            "checked_at": _NULLABLE_TIME,
            "lag_seconds": {"type": "number", "nullable": True},
            "last_success_at": _NULLABLE_TIME, "server_version": _NULLABLE_STRING,
            "failure": {**_NULLABLE_STRING, "description": "a cluster-level failure's reason "
                        "(its message is not shown: it may name another boundary's policy)"}},
        "description": "counts over this boundary's policies only"}]},
    "BoundaryPolicy": {"allOf": [_ref("BoundaryCounts"), {
        "type": "object",
        "required": ["id", "revision", "enabled", "rule_type", "invalid",
                     "deletion_requested_at", "clusters", "audit"],
        "properties": {
            "id": {"type": "string"}, "revision": {"type": "integer"},
            "enabled": {"type": "boolean"}, "rule_type": _NULLABLE_STRING,
            "invalid": _NULLABLE_STRING, "deletion_requested_at": _NULLABLE_TIME,
            "clusters": {"type": "integer", "description": "the boundary's clusters"},
            "audit": {"type": "object"}},
        "description": "counts over the boundary's clusters"}]},
    "BoundaryView": {
        "type": "object",
        "required": ["boundary", "now", "identity", "interval_seconds", "policies_total",
                     "policies", "unsupported_by_version", "listing", "clusters"],
        "properties": {
            "boundary": {"type": "string"}, "now": {"type": "string", "format": "date-time"},
            "identity": {"type": "string"}, "interval_seconds": {"type": "number"},
            "policies_total": {"type": "integer"},
            "policies": {"type": "array", "items": _ref("BoundaryPolicy"),
                         "maxItems": BOUNDARY_POLICIES_LISTED},
            "unsupported_by_version": {"type": "object", "additionalProperties": {
                "type": "array", "items": {"type": "string"}}},
            "rollouts": {"type": "array", "items": _ref("LiveRollout"),
                         "description": "the live rollouts of its policies, as of the last "
                                        "database sync (as in `/status`)"},
            "listing": {"type": "object"},
            "clusters": {"type": "array", "items": _ref("BoundaryCluster")}},
    },
    "BoundaryPolicyView": {"allOf": [_ref("PolicyView"), {
        "type": "object", "required": ["boundary"],
        "properties": {"boundary": {"type": "string"}}}]},
})

_BAD_ID = _answer("the id is not a valid id (the message says why)")
_AUTH = _answer("no or a wrong bearer token")
_NO_TOKEN_OR_DB = _answer("the database is unavailable, or CONVERGERD_API_TOKEN is unset "
                          "(the mutating endpoints are then disabled)")
_TOO_BIG = _answer("the body is over 16 KiB")
_BODY_LATE = _answer("the body did not arrive within CONVERGERD_HTTP_BODY_TIMEOUT_SECONDS "
                     "(default 10)")
_SHED = {**_answer("over this replica's status budget (CONVERGERD_STATUS_READS_PER_SECOND): "
                   "retry after `Retry-After` seconds"),
         "headers": {"Retry-After": {"description": "seconds to wait before asking again",
                                     "schema": {"type": "integer", "minimum": 1}}}}


def _mutation(summary: str, description: str, ok: str, extra: dict[str, Any],
              body: dict[str, Any] | None = None) -> dict[str, Any]:
    operation: dict[str, Any] = {
        "summary": summary, "description": description,
        "parameters": [_POLICY_ID], "security": [{"bearerAuth": []}],
        "responses": {
            "200": _answer(ok, "Report"),
            "400": _answer("bad id, a body that is not a JSON object, an unknown field, a "
                           "field of the wrong type, or an `enforcement` that is not Deny, "
                           "Warn or Audit (the message names the field and the value)"),
            "401": _AUTH, "404": _answer("no such policy", "Report"),
            "408": _BODY_LATE, "413": _TOO_BIG, "503": _NO_TOKEN_OR_DB, **extra,
        },
    }
    if body is not None:
        operation["requestBody"] = body
    return operation


_PATHS: dict[str, Any] = {
    "/healthz": {"get": {
        "summary": "liveness", "responses": {
            "200": _answer("the loop turns and every supervised task runs", "Health"),
            "500": _answer("the heartbeat is stale, a supervised task ended, or a loop is "
                           "stuck (what a restart fixes)", "Unhealthy")}}},
    "/readyz": {"get": {
        "summary": "readiness (standbys behind a live leader are ready too)",
        "parameters": [{"name": "exclude", "in": "query", "required": False,
                        "description": "a check to leave out (repeatable), as kube-apiserver's "
                                       "/readyz: lease_unreachable, lease_stalled, database",
                        "schema": {"type": "string"}}],
        "responses": {
            "200": _answer("settings valid, the election works and the database answers",
                           "Ready"),
            "503": _answer("settings invalid, the home cluster's Lease unreachable, a Lease "
                           "held by someone who does not renew it, or the database does not "
                           "answer in 5 s (what a restart does not fix)")}}},
    "/metrics": {"get": {
        "summary": "Prometheus text exposition", "responses": {"200": {
            "description": "the process's own registry",
            "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
    "/status": {"get": {
        "summary": "the replica's view of the fleet: leader, rounds, clusters worst first "
                   "(built once for many requests: see `now`)",
        "description": "Lists every cluster up to CONVERGERD_STATUS_MAX_CLUSTERS (default "
                       f"1000); past it, the fleet's counts and the worst {WORST_LISTED}, "
                       "a body that does not grow with the fleet. With `limit` or `after`, "
                       "a page of the clusters in id order under the same head: follow "
                       "`listing.next` from the document to walk every cluster once.",
        "parameters": [
            {"name": "limit", "in": "query", "required": False,
             "description": "a page of at most this many clusters (default and most: "
                            "CONVERGERD_STATUS_MAX_CLUSTERS)",
             "schema": {"type": "integer", "minimum": 1}},
            {"name": "after", "in": "query", "required": False,
             "description": "the page's clusters have ids after this one (the last id of "
                            "the page before)",
             "schema": {"type": "string", "pattern": _DNS_LABEL, "maxLength": 63}}],
        "responses": {"200": _answer("status", "Status"),
                      "400": _answer("`limit` or `after` is not a valid value (the message "
                                     "names it)"),
                      "429": _SHED}}},
    "/openapi.json": {"get": {
        "summary": "this document", "responses": {"200": {
            "description": "OpenAPI 3",
            "content": {JSON: {"schema": {"type": "object"}}}}}}},
    "/v1/clusters/{id}": {"get": {
        "summary": "one cluster's policies: delivered vs current revision, error, phase",
        "parameters": [_CLUSTER_ID], "responses": {
            "200": _answer("the cluster (database errors are reported in `database`)",
                           "ClusterView"),
            "400": _BAD_ID, "404": _answer("unknown cluster"), "429": _SHED}}},
    "/v1/policies/{id}/status": {"get": {
        "summary": "one policy per cluster: in scope, revisions, error, phase; a pending "
                   "deletion",
        "parameters": [_POLICY_ID], "responses": {
            "200": _answer("the policy", "PolicyView"), "400": _BAD_ID,
            "404": _answer("no such policy"), "429": _SHED,
            "503": _answer("the database is unavailable")}}},
    "/v1/policies/{id}/apply": {"post": _mutation(
        "save: apply the policy to every cluster in scope now",
        "Concurrently, under the save deadline; clusters that left the scope get it removed "
        "(unless the mass-removal guard skips them). A cluster that fails is recorded and "
        "reported; the save still succeeds (`partial`). Hung clusters do not hold the answer: "
        "it comes when every other cluster is done, listing them as `pending` (their writes go "
        "on until the save deadline and are recorded).",
        "done: `status` is `ok`, or `partial` when some cluster failed or is pending",
        {"409": _answer("its deletion has begun: DELETE it again to finish", "Report"),
         "422": _answer("the policy is invalid: nothing written", "Report")},
        body={"required": False, "content": {JSON: {"schema": _ref("SaveRequest")}}})},
    "/v1/exceptions": {"get": {
        "summary": "every exception to a policy (or one policy's), with its expiry",
        "parameters": [{"name": "policy", "in": "query", "required": False,
                        "description": "only this policy's",
                        "schema": {"type": "string", "pattern": _DNS_LABEL,
                                   "maxLength": POLICY_ID_MAX_LEN}}],
        "responses": {"200": _answer("the exceptions", "Exceptions"),
                      "400": _answer("`policy` is not a policy id"), "429": _SHED,
                      "503": _answer("the database is unavailable")}}},
    "/v1/policies/{id}/exceptions": {"post": {
        "summary": "grant an exception, then save the policy to its clusters",
        "description": "Checked first: every field (the message names the field and the "
                       "value), the expiry in the future and within "
                       "CONVERGERD_EXCEPTION_MAX_DAYS. Stored with a new revision of the "
                       "policy and recorded (who: `approvedBy`), then saved at once.",
        "parameters": [_POLICY_ID],
        "requestBody": {"required": True, "content": {JSON: {"schema": _ref("Exception")}}},
        "responses": {
            "201": _answer("granted and saved", "ExceptionChange"),
            "400": _answer("bad id, body, field or expiry (the message names it)"),
            "404": _answer("no such policy"), "408": _BODY_LATE,
            "409": _answer("the id is taken, 64 are in force, or the policy is being deleted"),
            "413": _TOO_BIG, "503": _NO_TOKEN_OR_DB}}},
    "/v1/policies/{id}/exceptions/{eid}": {"delete": {
        "summary": "withdraw an exception, then save the policy to its clusters",
        "parameters": [_POLICY_ID, {
            "name": "eid", "in": "path", "required": True, "description": "the exception id",
            "schema": {"type": "string", "pattern": _DNS_LABEL, "maxLength": 40}}],
        "requestBody": {"required": True,
                        "content": {JSON: {"schema": _ref("WithdrawRequest")}}},
        "responses": {
            "200": _answer("withdrawn and saved", "ExceptionChange"),
            "400": _answer("bad id or body; `by` missing"),
            "404": _answer("no such exception"), "408": _BODY_LATE,
            "409": _answer("the policy is being deleted"), "413": _TOO_BIG,
            "503": _NO_TOKEN_OR_DB}}},
    "/v1/policies/{id}": {"delete": _mutation(
        "delete: remove the policy from every cluster, then from the database",
        "The policy is marked first (rounds stop delivering it); the row goes only when every "
        "cluster removed it (404 counts as removed). The body, if any, must be an empty JSON "
        "object.",
        "removed everywhere and from the database",
        {"409": _answer("some cluster did not confirm: named in `error`; the policy is kept "
                        "(marked) and a retry finishes", "Report")},
        body={"required": False, "content": {JSON: {"schema": _ref("DeleteRequest")}}})},
}


_BOUNDARY = {"name": "boundary", "in": "path", "required": True,
             "description": "the boundary id (a label value of at most 63 characters)",
             "schema": {"type": "string", "maxLength": 63}}
_TOKEN_NAME = {"name": "name", "in": "path", "required": True,
               "description": "the token's name",
               "schema": {"type": "string", "pattern": _DNS_LABEL, "maxLength": NAME_MAX_CHARS}}
_DB_DOWN = _answer("the database is unavailable")
_PAGE = [
    {"name": "limit", "in": "query", "required": False,
     "description": "a page of at most this many clusters (default and most: "
                    "CONVERGERD_STATUS_MAX_CLUSTERS)",
     "schema": {"type": "integer", "minimum": 1}},
    {"name": "after", "in": "query", "required": False,
     "description": "the page's clusters have ids after this one",
     "schema": {"type": "string", "pattern": _DNS_LABEL, "maxLength": 63}}]
_PATHS.update({
    "/v1/tokens": {
        "post": {
            "summary": "create a read token for one boundary (shown once)",
            "requestBody": {"required": True,
                            "content": {JSON: {"schema": _ref("TokenRequest")}}},
            "responses": {
                "201": _answer("created: `token` is shown this once", "TokenCreated"),
                "400": _answer("a body that is not a JSON object, an unknown field, a bad "
                               "name, boundary id or expiry"),
                "408": _BODY_LATE, "409": _answer("the name is taken by a token not revoked, "
                                                  "or too many tokens are live"),
                "413": _TOO_BIG, "422": _answer("the boundary does not exist"),
                "503": _NO_TOKEN_OR_DB}},
        "get": {
            "summary": "the read tokens by name (never the tokens themselves)",
            "parameters": [{"name": "revoked", "in": "query", "required": False,
                            "description": "`true`: the revoked ones too",
                            "schema": {"type": "string", "enum": ["true", "false"]}}],
            "responses": {"200": _answer("the tokens", "TokenList"),
                          "400": _answer("`revoked` is not true or false"),
                          "503": _NO_TOKEN_OR_DB}}},
    "/v1/tokens/{name}": {"delete": {
        "summary": "revoke a read token: it stops working at once on this replica, on the "
                   "others within a second (a notification), at most 30 s",
        "parameters": [_TOKEN_NAME],
        "requestBody": {"required": False, "content": {JSON: {"schema": _ref("RevokeRequest")}}},
        "responses": {"200": _answer("revoked", "TokenRevoked"),
                      "400": _answer("a bad name or body"), "404": _answer("no live token "
                                                                           "of that name"),
                      "408": _BODY_LATE, "413": _TOO_BIG, "503": _NO_TOKEN_OR_DB}}},
    "/v1/boundaries/{boundary}": {"get": {
        "summary": "one boundary: its clusters (reached, lag, version) and its policies "
                   "(phases, Verified, violations with samples), over its clusters only",
        "description": "Clusters in id order, up to CONVERGERD_STATUS_MAX_CLUSTERS a page "
                       "(follow `listing.next`); the policies' counts always cover every "
                       f"cluster of the boundary; at most {BOUNDARY_POLICIES_LISTED} policies.",
        "parameters": [_BOUNDARY, *_PAGE],
        "responses": {"200": _answer("the boundary", "BoundaryView"),
                      "400": _answer("a bad boundary id, `limit` or `after`"),
                      "404": _answer("no such boundary (also what a read token of another "
                                     "boundary gets)"),
                      "429": _SHED, "503": _DB_DOWN}}},
    "/v1/boundaries/{boundary}/policies/{id}": {"get": {
        "summary": "one of the boundary's policies per cluster: revision, phase, Verified, "
                   "audit and its sample, last error",
        "parameters": [_BOUNDARY, _POLICY_ID],
        "responses": {"200": _answer("the policy", "BoundaryPolicyView"),
                      "400": _BAD_ID,
                      "404": _answer("no such boundary, or no such policy in it"),
                      "429": _SHED, "503": _DB_DOWN}}},
})

_SCHEMAS.update({
    "RevisionChange": {
        "type": "object", "required": ["field"],
        "properties": {
            "field": {"type": "string", "description": "a column of the policy's row: "
                      "`boundary_id`, `enabled`, `enforcement`, `rule`, ..."},
            "keys": {"type": "array", "items": {"type": "string"},
                     "maxItems": KEYS_LISTED,
                     "description": "a mapping's keys that changed (`rule`: e.g. "
                                    "`registries`)"},
            "before": {"nullable": True, "description": "a plain value before (a larger one "
                       "as its shortened JSON text)"},
            "after": {"nullable": True, "description": "and after"}},
    },
    "Revision": {
        "type": "object",
        "required": ["revision", "operation", "saved_at", "saved_by", "deleted", "readable",
                     "content", "what_changed"],
        "properties": {
            "revision": {"type": "integer", "minimum": 1},
            "operation": {"type": "string", "enum": [o.value for o in RevisionOperation],
                          "description": "baseline: the content when revisions began to be "
                                         "kept; delete: a tombstone, without content"},
            "saved_at": {"type": "string", "format": "date-time"},
            "saved_by": {**_NULLABLE_STRING,
                         "description": "who or what saved it: `<by> (rollback to N)`, "
                                        "`convergerd import`, `<role> (SQL)` for a plain SQL "
                                        "write (null: from another boundary)"},
            "deleted": {"type": "boolean"},
            "readable": {"type": "boolean",
                         "description": "false: its content cannot be read back"},
            "content": {"type": "object", "nullable": True, "additionalProperties": True,
                        "description": "the policy's row without its bookkeeping (null: a "
                                       "deletion, unreadable, or from another boundary)"},
            "what_changed": {
                "type": "object", "required": ["kind", "changes", "summary"],
                "properties": {
                    "kind": {"type": "string", "enum": [k.value for k in Kind]},
                    "changes": {"type": "array", "items": _ref("RevisionChange")},
                    "summary": {"type": "string", "description": "in one line"}}}},
    },
    "RevisionList": {
        "type": "object", "required": ["policy", "boundary", "retention", "revisions",
                                       "listing"],
        "properties": {
            "policy": {"type": "string"}, "boundary": _NULLABLE_STRING,
            "retention": {"type": "object", "properties": {
                "keep_last": {"type": "integer"},
                "max_age_days": {"type": "number", "nullable": True}}},
            "revisions": {"type": "array", "items": _ref("Revision"), "maxItems": PAGE_MAX},
            "listing": {"type": "object", "properties": {
                "complete": {"type": "boolean"},
                "next": {**_NULLABLE_STRING, "description": "the next page's path"}}}},
    },
    "RollbackRequest": {
        "type": "object", "additionalProperties": False, "required": ["to"],
        "properties": {
            "to": {"type": "integer", "minimum": 1,
                   "description": "the revision whose content becomes the new revision"},
            "now": {"type": "boolean", "default": False,
                    "description": "skip the policy's rollout strategy: every cluster at "
                                   "once, a rollout in progress ended"},
            "by": {"type": "string", "maxLength": BY_MAX_CHARS,
                   "description": "who asks, recorded with the revision (default: "
                                  "`admin token`)"}},
    },
    "RollbackReport": {"allOf": [_ref("Report"), {
        "type": "object", "required": ["rolled_back_to", "changed"],
        "properties": {
            "rolled_back_to": {"type": "integer"},
            "changed": {"type": "boolean", "description": "false: the policy already had that "
                        "content (no new revision; saved again)"},
            "now": {"type": "boolean"}}}]},
})
_HISTORY_PAGE = [
    {"name": "limit", "in": "query", "required": False,
     "description": f"revisions listed, newest first (default {PAGE_DEFAULT}, at most "
                    f"{PAGE_MAX})",
     "schema": {"type": "integer", "minimum": 1, "maximum": PAGE_MAX}},
    {"name": "before", "in": "query", "required": False,
     "description": "only revisions older than this one (`listing.next`)",
     "schema": {"type": "integer", "minimum": 1}}]
_HISTORY_ANSWERS = {"400": _answer("a bad id, `limit` or `before`"), "429": _SHED,
                    "503": _DB_DOWN}
_PATHS.update({
    "/v1/policies/{id}/revisions": {"get": {
        "summary": "the policy's kept revisions, newest first: when, by whom, what changed",
        "description": "Every save of the policy's row, by any writer (a trigger records "
                       "them), kept up to CONVERGERD_REVISION_RETENTION per policy; a deleted "
                       "policy's history stays (its last revision is the deletion).",
        "parameters": [_POLICY_ID, *_HISTORY_PAGE],
        "responses": {"200": _answer("a page of the history", "RevisionList"),
                      "404": _answer("no such policy, and no revision of it kept"),
                      **_HISTORY_ANSWERS}}},
    "/v1/boundaries/{boundary}/policies/{id}/revisions": {"get": {
        "summary": "the history of one of the boundary's policies (revisions from when it was "
                   "in another boundary show no content, author nor change)",
        "parameters": [_BOUNDARY, _POLICY_ID, *_HISTORY_PAGE],
        "responses": {"200": _answer("a page of the history", "RevisionList"),
                      "404": _answer("no such boundary, or no such policy in it"),
                      **_HISTORY_ANSWERS}}},
    "/v1/policies/{id}/rollback": {"post": {
        "summary": "roll back: an old revision's content as the new revision, saved at once",
        "description": "The content of revision `to` is written as the policy's new revision "
                       "(a deleted policy is created again), recorded with `by`, then saved "
                       "like `POST /v1/policies/{id}/apply`: every cluster in scope at once.",
        "parameters": [_POLICY_ID], "security": [{"bearerAuth": []}],
        "requestBody": {"required": True,
                        "content": {JSON: {"schema": _ref("RollbackRequest")}}},
        "responses": {
            "200": _answer("rolled back and saved: `status` `ok`, or `partial`",
                           "RollbackReport"),
            "400": _answer("a bad id, a body that is not a JSON object, an unknown field, "
                           "a field of the wrong type, no `to`"),
            "404": _answer("no such policy, or that revision is not kept (the message says "
                           "which are)"),
            "408": _BODY_LATE,
            "409": _answer("that revision is a deletion, or the policy's deletion has begun: "
                           "nothing written"),
            "413": _TOO_BIG,
            "422": _answer("that revision's content is not a valid policy now (its boundary "
                           "is gone, ...): nothing written"),
            "503": _NO_TOKEN_OR_DB}}},
})

_SCHEMAS.update({
    "Rollout": {
        "type": "object",
        "required": ["id", "policy", "to_revision", "from_revision", "strategy", "state",
                     "wave", "gate", "reason", "created_at", "updated_at", "updated_by"],
        "properties": {
            "id": {"type": "integer"},
            "policy": {"type": "string"},
            "to_revision": {"type": "integer", "description": "the revision it rolls out"},
            "from_revision": {"type": "integer", "nullable": True,
                              "description": "the policy's revision before (null: new)"},
            "strategy": {"type": "string"},
            "state": {"type": "string", "enum": [s.value for s in State]},
            "wave": {"type": "object", "required": ["index", "name", "of", "warn_step"],
                     "properties": {
                         "index": {"type": "integer"}, "name": {"type": "string"},
                         "of": {"type": "integer", "description": "waves in the strategy"},
                         "warn_step": {"type": "boolean",
                                       "description": "the wave runs the revision in Warn"},
                         "started_at": {**_NULLABLE_STRING, "format": "date-time"},
                         "ready_at": {**_NULLABLE_STRING, "format": "date-time",
                                      "description": "every cluster reported: the bake "
                                                     "started"}}},
            "gate": {"type": "string", "nullable": True, "enum": [*(g.value for g in Gate), None],
                     "description": "what holds it (or failed), as last written"},
            "reason": {**_NULLABLE_STRING, "description": "`gate: detail`, or a command's "
                       "`<what> by <who>`"},
            "created_at": {"type": "string", "format": "date-time"},
            "updated_at": {"type": "string", "format": "date-time"},
            "updated_by": {"type": "string"},
            "clusters_written": {"type": "array", "items": {"type": "object"},
                                 "description": "a command's answer: the clusters it made "
                                                "due something else, written at once"}},
    },
    "RolloutList": {"type": "object", "required": ["rollouts"], "properties": {
        "boundary": {"type": "string", "description": "a boundary's list: its policies' only"},
        "rollouts": {"type": "array", "items": _ref("Rollout")}}},
    "RolloutView": {"allOf": [_ref("Rollout"), {
        "type": "object", "required": ["in_force", "events"],
        "properties": {
            "in_force": {"type": "boolean", "description": "false: its latest rollout, ended"},
            "boundary": {"type": "string", "description": "a boundary's view"},
            "bake_seconds": {"type": "number", "description": "in force: the strategy's bake "
                             "per wave (twice for a wave in Warn first)"},
            "on_halt": {"type": "string", "enum": [o.value for o in OnHalt]},
            "waves": {"type": "array", "description": "in force: each wave of its strategy",
                      "items": {"type": "object", "properties": {
                "index": {"type": "integer"}, "name": {"type": "string"},
                "selector": {"type": "object", "nullable": True,
                             "additionalProperties": {"type": "string"}},
                "fraction": {"type": "number", "nullable": True},
                "warn_first": {"type": "boolean"}, "approval": {"type": "boolean"},
                "progress": {"type": "string", "enum": [
                    "done", "current", "waiting", "sent_back", "not_reached"]},
                "clusters": {"type": "integer"},
                "revisions": {"type": "array", "items": {"type": "object", "properties": {
                    "revision": {"type": "integer", "nullable": True},
                    "clusters": {"type": "integer"},
                    "named": {"type": "array", "items": {"type": "string"},
                              "maxItems": CLUSTERS_NAMED,
                              "description": "the first of these clusters by id"}}}}}}},
            "clusters": {"type": "object", "description": "its clusters reporting the new "
                         "revision, another one, none", "properties": {
                             "new": {"type": "integer"}, "old": {"type": "integer"},
                             "none": {"type": "integer"}}},
            "now": {"type": "object", "description": "in progress: what holds it at this "
                    "moment, with counts, as the gate job would find it", "properties": {
                        "gate": {"type": "string", "enum": [g.value for g in Gate]},
                        "detail": {"type": "string"}}},
            "events": {"type": "array", "items": {"type": "object", "properties": {
                "at": {"type": "string", "format": "date-time"}, "by": {"type": "string"},
                "what": {"type": "string"}, "wave": {"type": "integer", "nullable": True},
                "detail": _NULLABLE_STRING}}}}}]},
    "RolloutCommand": {
        "type": "object", "additionalProperties": False,
        "properties": {"by": {"type": "string", "maxLength": BY_MAX_CHARS,
                              "description": "who asks, recorded with the event (default: "
                                             "`admin token`)"}}},
})
_COMMANDS = {
    Command.PAUSE: "pause a rollout in progress (its clusters keep what they hold)",
    Command.RESUME: "resume a paused or halted rollout where it stopped (a gate that still "
                    "fails halts it again)",
    Command.APPROVE: "approve the wave a rollout waits at: its clusters get the revision now",
    Command.ABORT: "abort: every cluster back to the revision it had before",
}
_PATHS.update({
    "/v1/rollouts": {"get": {
        "summary": "every live rollout: its wave, state and the gate that holds it",
        "responses": {"200": _answer("the live rollouts", "RolloutList"), "429": _SHED,
                      "503": _DB_DOWN}}},
    "/v1/policies/{id}/rollout": {"get": {
        "summary": "the policy's rollout in force (else its latest): its waves, which "
                   "clusters report which revision, what holds it now, its events",
        "parameters": [_POLICY_ID],
        "responses": {"200": _answer("the rollout", "RolloutView"), "400": _BAD_ID,
                      "404": _answer("the policy never had a rollout"), "429": _SHED,
                      "503": _DB_DOWN}}},
    "/v1/boundaries/{boundary}/rollouts": {"get": {
        "summary": "the live rollouts of the boundary's policies",
        "parameters": [_BOUNDARY],
        "responses": {"200": _answer("the live rollouts", "RolloutList"),
                      "400": _answer("a bad boundary id"),
                      "404": _answer("no such boundary (also what a read token of another "
                                     "boundary gets)"),
                      "429": _SHED, "503": _DB_DOWN}}},
    "/v1/boundaries/{boundary}/policies/{id}/rollout": {"get": {
        "summary": "one of the boundary's policies' rollout, as `/v1/policies/{id}/rollout` "
                   "shows it (its clusters are the boundary's)",
        "parameters": [_BOUNDARY, _POLICY_ID],
        "responses": {"200": _answer("the rollout", "RolloutView"), "400": _BAD_ID,
                      "404": _answer("no such policy in the boundary, or it never had a "
                                     "rollout there (one answer for both)"),
                      "429": _SHED, "503": _DB_DOWN}}},
    **{f"/v1/policies/{{id}}/rollout/{command.value}": {"post": {
        "summary": summary,
        "parameters": [_POLICY_ID], "security": [{"bearerAuth": []}],
        "requestBody": {"required": False,
                        "content": {JSON: {"schema": _ref("RolloutCommand")}}},
        "responses": {
            "200": _answer("done: the rollout as it is now, with the clusters written",
                           "Rollout"),
            "400": _answer("a bad id, a body that is not a JSON object, an unknown field"),
            "404": _answer("the policy has no rollout in force"),
            "408": _BODY_LATE,
            "409": _answer("the rollout is not in a state this applies to, or it moved "
                           "meanwhile: nothing written"),
            "413": _TOO_BIG, "503": _NO_TOKEN_OR_DB}}}
       for command, summary in _COMMANDS.items()},
})

# Each route's answers to its token, from its scope (`scopes.ROUTE_SCOPES`).
_SCOPE_ANSWERS: dict[Scope, dict[str, Any]] = {
    Scope.PUBLIC: {},
    Scope.FLEET: {"401": _answer("a token that opens nothing (unknown, revoked, expired); "
                                 "or none, when CONVERGERD_FLEET_READS_NEED_TOKEN"),
                  "403": _answer("a boundary's read token: it reads only its boundary")},
    Scope.ADMIN: {"401": _AUTH, "403": _answer("a boundary's read token")},
    Scope.BOUNDARY: {"401": _answer("no token, or one that opens nothing")},
}
_SECURITY: dict[Scope, list[dict[str, list[str]]]] = {
    Scope.FLEET: [{}, {"bearerAuth": []}], Scope.ADMIN: [{"bearerAuth": []}],
             Scope.BOUNDARY: [{"bearerAuth": []}]}
_PER_TOKEN = _answer("over this token's reads (CONVERGERD_TOKEN_READS_PER_SECOND), or over "
                     "the replica's status budget: retry after `Retry-After` seconds")
for (_method, _path), _scope in ROUTE_SCOPES.items():
    if _scope is Scope.PAGE:  # the web page (HTML for a browser) is not this API
        continue
    _operation = _PATHS[_path][_method.lower()]
    _operation["responses"] = {**_SCOPE_ANSWERS[_scope], **_operation["responses"]}
    if _scope is not Scope.PUBLIC:
        _operation["security"] = _SECURITY[_scope]
        if _method == "GET":
            _operation["responses"].setdefault("429", _PER_TOKEN)


def _head(get: dict[str, Any]) -> dict[str, Any]:
    """HEAD of a GET route (aiohttp serves both): the same answers, without their bodies."""
    head = {"summary": f"{get['summary']} (headers only)",
            "responses": {status: {k: v for k, v in answer.items() if k != "content"}
                          for status, answer in get["responses"].items()}}
    if "parameters" in get:
        head["parameters"] = get["parameters"]
    return head


for _item in _PATHS.values():
    if "get" in _item:
        _item["head"] = _head(_item["get"])

# Answers of the server itself, for any path (not repeated per operation).
_SERVER_ANSWERS = (
    "Every error is JSON (`{\"error\": ...}`), the server's own included: 404 for an unknown "
    "path; 405 for a method the path does not have, with `Allow`; 400 for a request the parser "
    "refuses (a request line or header over 8,190 bytes, more than 64 headers, not HTTP), "
    "with a fixed text that quotes nothing of the request; 408 "
    "when the request line and headers do not arrive within "
    "CONVERGERD_HTTP_HEADER_TIMEOUT_SECONDS (default 10); 503 with `Retry-After` when all "
    "CONVERGERD_HTTP_MAX_CONNECTIONS (default 256) connections are serving or sending requests "
    "(idle ones are closed to make room; a request that arrived is answered); 417 for "
    "an `Expect` other than 100-continue, and a mutation's token is checked before `100 "
    "Continue`. A kept-alive connection is closed after "
    "CONVERGERD_HTTP_IDLE_TIMEOUT_SECONDS (default 30) without a request."
)


def document() -> dict[str, Any]:
    """The OpenAPI 3 document of the whole HTTP API."""
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "convergerd",
            "version": __version__,
            "description": "Health, metrics, status, saving and deleting policies, their "
                           "revisions and rollback, rollouts, read tokens and what one "
                           "boundary's "
                           "token may read. "
                           + _SERVER_ANSWERS,
        },
        "paths": _PATHS,
        "components": {
            "schemas": _SCHEMAS,
            "securitySchemes": {"bearerAuth": {
                "type": "http", "scheme": "bearer",
                "description": "the admin token (CONVERGERD_API_TOKEN), or a boundary's read "
                               "token (`cvg_b_...`, `convergerd token create`) on "
                               "/v1/boundaries/{boundary}"}},
        },
    }
