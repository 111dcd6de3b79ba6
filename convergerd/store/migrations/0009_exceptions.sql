-- convergerd 0009: exceptions to a policy that expire (docs/design.md, "Exceptions"), and the
-- record of every change to them (who, when, what).
--
-- Written by convergerd only (the API, `convergerd import`, and the lapse of an expired one),
-- each change in one transaction with a new revision of its policy: the exceptions in force
-- travel in the Policy's `spec.exceptions`, so a change is delivered like a save (the revision
-- raised, the policies trigger notifies, the leader saves it). Rows stay after they expire
-- (`lapsed_revision` says which revision dropped them) until no cluster is recorded with a
-- revision that carried them and 30 days have passed.
CREATE TABLE policy_exceptions (
    policy_id        text        NOT NULL REFERENCES policies (id)
                                 ON DELETE CASCADE ON UPDATE CASCADE,
    id               text        NOT NULL,
    namespace        text        NOT NULL,
    name             text,
    selector         jsonb,                      -- {"matchLabels": {...}}
    reason           text        NOT NULL,
    requested_by     text        NOT NULL,
    approved_by      text        NOT NULL,
    expires_at       timestamptz NOT NULL,
    granted_at       timestamptz NOT NULL DEFAULT now(),
    granted_revision bigint      NOT NULL,       -- the first revision of the policy carrying it
    lapsed_revision  bigint,                     -- the revision that dropped it once expired
    PRIMARY KEY (policy_id, id),
    CHECK (name IS NULL OR selector IS NULL)
);
CREATE INDEX policy_exceptions_unlapsed_idx ON policy_exceptions (expires_at)
    WHERE lapsed_revision IS NULL;

-- Every grant, withdrawal, import and lapse: who (the approver of a grant or import, the
-- caller of a withdrawal, `convergerd` for a lapse), when, and what (the exception as it was).
CREATE TABLE exception_changes (
    id           bigserial   PRIMARY KEY,
    at           timestamptz NOT NULL DEFAULT now(),
    action       text        NOT NULL CHECK (action IN ('grant', 'withdraw', 'import', 'lapse')),
    policy_id    text        NOT NULL,
    exception_id text        NOT NULL,
    actor        text        NOT NULL,
    revision     bigint,                         -- the policy's revision after the change
    detail       jsonb       NOT NULL
);
CREATE INDEX exception_changes_policy_idx ON exception_changes (policy_id, at);
