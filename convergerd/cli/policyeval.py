"""`convergerd policy eval --policy FILE (--object FILE... | --context NAME | --replay SESSION)`:
a policy's verdict on objects: given ones, a live cluster's, or a recorded session's.

The policy is rendered exactly as the in-cluster operator renders it
(`convergerd.admission.render.render_admission`) and evaluated as kube-apiserver does
(`convergerd.admission.evaluate`, the evaluator a simulated cluster's admission uses): the same
CEL runtime and the same matching, so the verdict and message are the ones `kubectl create`
would get there.

A policy in mode Warn or Audit is judged as a cluster judges it (a note says so): what its rule
fails is allowed with the warning the cluster would send (Warn) or with its audit annotation
noted (Audit); the same object is denied once the policy is in mode Deny.

Namespaces: without `--namespace-labels` every object is evaluated as if it were in a
namespace of the policy's boundary (the binding's namespaceSelector is then met by
construction); with it, the selector is applied to those labels, as a cluster would.
Objects are taken as created (operation CREATE).

Live (`--context NAME`): the objects come from a cluster: the namespaces labelled
`platform.stackship.se/boundary=<boundary>`, and in each of them every object of the workload
kinds the rendered policy matches (`admission.render.RESOURCE_RULES`) that the cluster
serves (discovery), listed in pages (`--page-size`, following `continue`). Each object is
evaluated with its own namespace's labels. `--record SESSION` writes every API exchange to a
session file; `--replay SESSION` makes the same requests to that file instead of a cluster
and gives the same report and exit code (`convergerd.cli.session`).

A binding whose `validationActions` are `Warn` (or `Audit`) admits: the verdict is allowed and
carries the warnings a cluster would send (kubectl prints them as `Warning: ...`), printed under
the object, and whether the audit annotation would be written.

Exit codes: 0 every object admitted, 1 some denied, 2 an input error (a file, a flag, a
session that does not match, a cluster that cannot be read).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from convergerd import eventloop
from convergerd.admission.render import (
    BOUNDARY_LABEL,
    RESOURCE_RULES,
    RenderError,
    render_admission,
)
from convergerd.cli.session import (
    LiveTransport,
    Recorder,
    Replayer,
    Session,
    SessionError,
    Transport,
    load_session,
    policy_ref,
    write_session,
)
from convergerd.config import ClusterAccess
from convergerd.core.decode import list_page
from convergerd.core.errors import BadFile, BadResponse, ConvergerdError
from convergerd.core.model import ClusterId, Enforcement
from convergerd.core.shown import shown
from convergerd.files import read_bounded
from convergerd.kube.kubeconfig import ALLOW_INSECURE_SETTING
from convergerd.kube.kubeconfig import SETTING as KUBECONFIG_SETTING
from convergerd.kube.registry import ClusterRegistry
from convergerd.store.yamlfile import load_yaml_documents

EXIT_ALLOWED = 0
EXIT_DENIED = 1
EXIT_USAGE = 2
MAX_FILE_BYTES = 4 * 1024 * 1024
MAX_OBJECTS = 10_000
DEFAULT_PAGE_SIZE = 500
LIVE_TIMEOUT_S = 30.0
_POLICY_KIND = ("platform.stackship.se/v1alpha1", "Policy")
# The kinds a cluster serves that the rules can match: (apiVersion, kind) -> plural.
_RESOURCES = {
    ("v1", "Pod"): "pods",
    ("apps/v1", "Deployment"): "deployments",
    ("apps/v1", "ReplicaSet"): "replicasets",
    ("apps/v1", "StatefulSet"): "statefulsets",
    ("apps/v1", "DaemonSet"): "daemonsets",
    ("batch/v1", "Job"): "jobs",
    ("batch/v1", "CronJob"): "cronjobs",
}


class EvalInputError(ConvergerdError):
    """A file or flag that cannot be used; the message names the file and the problem."""


@dataclass(frozen=True)
class Verdict:
    source: str  # "file.yaml#2": the file and the object's position in it (1-based)
    kind: str
    namespace: str
    name: str
    allowed: bool
    message: str = ""
    reason: str = ""
    code: int = 0
    matched: bool = True
    warnings: tuple[str, ...] = ()  # what a `Warn` binding answers with
    audited: bool = False  # an `Audit` binding would write the audit annotation

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "source": self.source, "kind": self.kind, "namespace": self.namespace,
            "name": self.name, "allowed": self.allowed, "matched": self.matched,
        }
        if not self.allowed:
            out |= {"message": self.message, "reason": self.reason, "code": self.code}
        if self.warnings:
            out["warnings"] = list(self.warnings)
        if self.audited:
            out["audited"] = True
        return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policy", type=Path, required=True,
                        help="a Policy object, or one policy entry of an import file (YAML/JSON)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--object", type=Path, nargs="+", dest="objects",
                        metavar="FILE", help="objects to evaluate: YAML (several documents) "
                        "or JSON, or a List")
    source.add_argument("--context", metavar="NAME",
                        help="evaluate the objects of a live cluster (this kubeconfig context) "
                        "in the namespaces of the policy's boundary")
    source.add_argument("--replay", type=Path, metavar="SESSION",
                        help="evaluate from a session recorded with --record, with no cluster")
    parser.add_argument("--namespace-labels", metavar="K=V,...",
                        help="with --object: labels of the objects' namespace (default: a "
                        "namespace of the policy's boundary)")
    parser.add_argument("--kubeconfig", type=Path, metavar="K",
                        help=f"with --context: the kubeconfig [default: {KUBECONFIG_SETTING}, "
                        "else KUBECONFIG, else ~/.kube/config]")
    parser.add_argument("--record", type=Path, metavar="SESSION",
                        help="with --context: write every API exchange to this session file")
    parser.add_argument("--page-size", type=int, default=None, metavar="N",
                        help=f"with --context: objects per list request (default "
                        f"{DEFAULT_PAGE_SIZE}; a replay uses the recorded one)")
    parser.add_argument("--json", action="store_true", help="print the verdicts as JSON")


def _documents(path: Path) -> list[Any]:
    try:
        return load_yaml_documents(read_bounded(path, MAX_FILE_BYTES,
                                                setting="policy eval's limit"))
    except BadFile as exc:
        raise EvalInputError(f"{path}: {exc}") from None


def policy_spec(doc: Any, source: str) -> dict[str, Any]:
    """The Policy `spec` from a Policy object or an import-file policy entry."""
    if not isinstance(doc, Mapping):
        raise EvalInputError(f"{source}: expected a Policy object or a policy entry "
                             f"({{id, boundary, rule}}), got {shown(doc)}")
    if (doc.get("apiVersion"), doc.get("kind")) == _POLICY_KIND:
        spec = doc.get("spec")
        if not isinstance(spec, Mapping):
            raise EvalInputError(f"{source}: the Policy has no spec mapping")
        return dict(spec)
    if "kind" in doc or "apiVersion" in doc:
        raise EvalInputError(
            f"{source}: kind {shown(doc.get('kind'))} ({shown(doc.get('apiVersion'))}) is not "
            f"a Policy; expected apiVersion {_POLICY_KIND[0]}, kind Policy"
        )
    if "policies" in doc:
        raise EvalInputError(f"{source}: this is a whole import file; give one policy entry "
                             "({id, boundary, rule}) or a Policy object")
    unknown = set(doc) - {"id", "boundary", "enabled", "rule", "enforcement"}
    if unknown:
        raise EvalInputError(f"{source}: unknown field(s) in the policy entry: "
                             f"{shown(sorted(map(str, unknown)))}")
    spec = {"policyId": doc.get("id"), "boundary": doc.get("boundary"),
            "enabled": doc.get("enabled", True), "revision": 1, "rule": doc.get("rule")}
    if "enforcement" in doc:
        spec["enforcement"] = doc["enforcement"]
    return spec


def load_policy(path: Path) -> dict[str, Any]:
    docs = _documents(path)
    if len(docs) != 1:
        raise EvalInputError(f"{path}: expected one policy, found {len(docs)} documents")
    return policy_spec(docs[0], str(path))


def _objects(path: Path) -> Iterator[tuple[str, Mapping[str, Any]]]:
    index = 0
    for doc in _documents(path):
        items = doc.get("items") if isinstance(doc, Mapping) and \
            str(doc.get("kind", "")).endswith("List") else [doc]
        if not isinstance(items, list):
            raise EvalInputError(f"{path}: a List without an items list")
        for item in items:
            index += 1
            if not isinstance(item, Mapping) or not isinstance(item.get("kind"), str):
                raise EvalInputError(f"{path}: object {index} is not a Kubernetes object "
                                     f"(a mapping with apiVersion and kind): {shown(item)}")
            yield f"{path}#{index}", item


def parse_labels(text: str | None) -> dict[str, str] | None:
    if text is None:
        return None
    labels: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, eq, value = part.partition("=")
        if not eq or not key:
            raise EvalInputError(f"--namespace-labels: {shown(part)} is not key=value")
        labels[key.strip()] = value.strip()
    return labels


class PolicyEval:
    """The rendered policy and binding, evaluated on objects one at a time."""

    def __init__(self, spec: Mapping[str, Any], namespace_labels: Mapping[str, str] | None):
        # Imported here: the CEL runtime is in the `sim` extra (cli.main says so when it is
        # missing), and `convergerd --help` imports this module without it.
        from convergerd.admission import evaluate

        self._evaluate = evaluate
        self.admission = render_admission(spec)
        self.boundary = str(spec["boundary"])
        self.enabled = spec.get("enabled", True) is not False
        self._namespace_labels = namespace_labels
        self._evaluator = evaluate.PolicyEvaluator()

    def verdict(self, source: str, obj: Mapping[str, Any],
                namespace_labels: Mapping[str, str] | None = None) -> Verdict:
        """`namespace_labels`: the labels of the object's namespace, as read from a cluster
        (default: those given to the constructor, else a namespace of the boundary)."""
        evaluate = self._evaluate
        meta = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
        assert isinstance(meta, Mapping)
        kind, api_version = str(obj.get("kind")), str(obj.get("apiVersion", ""))
        name = str(meta.get("name") or meta.get("generateName") or "")
        namespace = str(meta.get("namespace") or "default")
        plural = _RESOURCES.get((api_version, kind))
        if plural is None:
            return Verdict(source, kind, namespace, name, allowed=True, matched=False)
        group, _, version = api_version.rpartition("/")
        given = namespace_labels if namespace_labels is not None else self._namespace_labels
        labels = dict(given) if given is not None else {BOUNDARY_LABEL: self.boundary}
        labels["kubernetes.io/metadata.name"] = namespace
        ns_obj = {"apiVersion": "v1", "kind": "Namespace",
                  "metadata": {"name": namespace, "labels": labels}}
        attrs = evaluate.Attributes(
            operation="CREATE", group=group, version=version, resource=plural, kind=kind,
            namespace=namespace, name=name, object=dict(obj) | {"metadata": dict(meta) | {
                "namespace": namespace}}, old_object=None,
        )
        outcome = self._evaluator.admit(
            [self.admission.policy], [self.admission.binding], attrs, namespace=ns_obj
        )
        denial, warnings, audited = outcome.denial, outcome.warnings, bool(outcome.annotations)
        if denial is None:
            return Verdict(source, kind, namespace, name, allowed=True, warnings=warnings,
                           audited=audited)
        return Verdict(source, kind, namespace, name, allowed=False,
                       message=evaluate.forbidden_message(attrs, denial), reason=denial.reason,
                       code=denial.code, warnings=warnings, audited=audited)


def evaluate_files(
    policy: Path, objects: Sequence[Path], namespace_labels: Mapping[str, str] | None
) -> tuple[PolicyEval, list[Verdict]]:
    spec = load_policy(policy)
    try:
        evaluator = PolicyEval(spec, namespace_labels)
    except RenderError as exc:
        raise EvalInputError(f"{policy}: cannot be enforced ({exc.reason}): {exc}") from None
    verdicts: list[Verdict] = []
    for path in objects:
        for source, obj in _objects(path):
            if len(verdicts) >= MAX_OBJECTS:
                raise EvalInputError(f"{path}: more than {MAX_OBJECTS} objects in all")
            verdicts.append(evaluator.verdict(source, obj))
    return evaluator, verdicts


@dataclass(frozen=True)
class Kind:
    """A workload kind the policy matches and the cluster serves."""

    group: str
    version: str
    plural: str
    kind: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        return f"{base}/namespaces/{urllib.parse.quote(namespace, safe='')}/{self.plural}"


async def served_kinds(api: Transport) -> list[Kind]:
    """The kinds of `RESOURCE_RULES` that discovery lists, in the rules' order (a group
    version the cluster does not serve answers 404)."""
    kinds: list[Kind] = []
    for group, version, plurals in RESOURCE_RULES:
        path = f"/apis/{group}/{version}" if group else f"/api/{version}"
        response = await api.get(path, {})
        if response.status == 404:
            continue
        resources = response.body.get("resources")
        if not isinstance(resources, list):
            raise BadResponse(f"GET {path}: discovery answer: resources: expected a list, got "
                              f"{shown(resources)}")
        served = {r["name"]: r.get("kind") for r in resources
                  if isinstance(r, dict) and isinstance(r.get("name"), str)}
        kinds.extend(Kind(group, version, plural, kind)
                     for plural in plurals if "/" not in plural
                     and isinstance(kind := served.get(plural), str) and kind)
    return kinds


async def _pages(api: Transport, path: str, query: Mapping[str, str],
                 page_size: int) -> list[dict[str, Any]]:
    """Every item of a list, page by page (`limit`, then `continue` until there is none)."""
    items: list[dict[str, Any]] = []
    token: str | None = None
    while True:
        page_query = {**query, "limit": str(page_size)}
        if token is not None:
            page_query["continue"] = token
        response = await api.get(path, page_query)
        if not 200 <= response.status < 300:
            raise BadResponse(f"GET {path}: {response.status} (the kind is not served)")
        page = list_page(response.body)
        items.extend(page.items)
        if len(items) > MAX_OBJECTS:
            raise EvalInputError(f"more than {MAX_OBJECTS} objects to evaluate")
        if page.continue_token is not None and page.continue_token == token:
            raise BadResponse(f"GET {path}: metadata.continue: the same token again (the list "
                              "would never end)")
        token = page.continue_token
        if token is None:
            return items


def _namespace(doc: Mapping[str, Any]) -> tuple[str, dict[str, str]]:
    meta = doc.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    labels = meta.get("labels") if isinstance(meta, dict) else None
    if not isinstance(name, str) or not name:
        raise BadResponse(f"namespace list: an item without metadata.name: {shown(doc)}")
    if labels is None:
        labels = {}
    if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
        raise BadResponse(f"namespace {shown(name)}: metadata.labels: expected a mapping of "
                          f"strings, got {shown(labels)}")
    return name, labels


async def evaluate_cluster(api: Transport, evaluator: PolicyEval, *, source: str,
                           page_size: int) -> tuple[int, list[Verdict]]:
    """How many namespaces the boundary has, and the verdict on every object of the matched
    kinds in them. The requests, in order: discovery of each group version of
    `RESOURCE_RULES`, the boundary's namespaces, then per namespace per served kind a list."""
    kinds = await served_kinds(api)
    selector = f"{BOUNDARY_LABEL}={evaluator.boundary}"
    namespaces = [_namespace(doc) for doc in await _pages(
        api, "/api/v1/namespaces", {"labelSelector": selector}, page_size)]
    verdicts: list[Verdict] = []
    for name, labels in namespaces:
        for kind in kinds:
            for item in await _pages(api, kind.path(name), {}, page_size):
                meta = item.get("metadata")
                obj = item | {"apiVersion": kind.api_version, "kind": kind.kind,
                              "metadata": (meta if isinstance(meta, dict) else {})
                              | {"namespace": name}}
                verdicts.append(evaluator.verdict(source, obj, labels))
                if len(verdicts) > MAX_OBJECTS:
                    raise EvalInputError(f"more than {MAX_OBJECTS} objects to evaluate")
    return len(namespaces), verdicts


def kubeconfig_path(flag: Path | None, env: Mapping[str, str]) -> Path:
    """`--kubeconfig`, else `CONVERGERD_KUBECONFIG`, else the first of `KUBECONFIG`, else
    ~/.kube/config."""
    if flag is not None:
        return flag
    if env.get(KUBECONFIG_SETTING):
        return Path(env[KUBECONFIG_SETTING])
    first = env.get("KUBECONFIG", "").split(os.pathsep)[0]
    return Path(first) if first else Path.home() / ".kube" / "config"


async def _record(args: argparse.Namespace, evaluator: PolicyEval, page_size: int,
                  env: Mapping[str, str]) -> tuple[int, list[Verdict], Recorder]:
    path = kubeconfig_path(args.kubeconfig, env)
    access = ClusterAccess(
        kubeconfig=path, request_timeout_s=LIVE_TIMEOUT_S, connect_timeout_s=10.0, qps=50.0,
        burst=100, apply_concurrency=1,
        allow_insecure=env.get(ALLOW_INSECURE_SETTING, "").strip().lower() == "true")
    registry = ClusterRegistry(kubeconfig=path, access=access, identity="policy-eval",
                               env=env)
    try:
        recorder = Recorder(LiveTransport(registry.client(ClusterId(args.context)),
                                          timeout_s=LIVE_TIMEOUT_S))
        count, verdicts = await evaluate_cluster(recorder, evaluator, source=args.context,
                                                 page_size=page_size)
    finally:
        await registry.close()
    return count, verdicts, recorder


def _live(args: argparse.Namespace, spec: Mapping[str, Any], evaluator: PolicyEval,
          env: Mapping[str, str]) -> tuple[str, int, list[Verdict]]:
    page_size = args.page_size or DEFAULT_PAGE_SIZE
    try:
        count, verdicts, recorder = eventloop.run(_record(args, evaluator, page_size, env))
    except (EvalInputError, SessionError):
        raise
    except ConvergerdError as exc:
        raise EvalInputError(f"context {shown(args.context)}: {exc}") from None
    if args.record is not None:
        session = Session(policy=policy_ref(spec), context=args.context,
                          recorded_at=datetime.now(UTC).isoformat(timespec="seconds"),
                          page_size=page_size, exchanges=tuple(recorder.exchanges))
        try:
            write_session(args.record, session)
        except OSError as exc:
            raise EvalInputError(f"--record {args.record}: cannot write: "
                                 f"{exc.strerror or exc}") from None
    return args.context, count, verdicts


def _replay(args: argparse.Namespace, spec: Mapping[str, Any],
            evaluator: PolicyEval) -> tuple[str, int, list[Verdict]]:
    source = str(args.replay)
    session = load_session(args.replay)
    given = policy_ref(spec)
    if given != session.policy:
        raise SessionError(f"{source}: recorded for {session.policy}; --policy {args.policy} is "
                           f"{given}: record a session with this policy")
    replayer = Replayer(session, source)
    try:
        count, verdicts = eventloop.run(evaluate_cluster(
            replayer, evaluator, source=session.context, page_size=session.page_size))
    except BadResponse as exc:
        raise SessionError(f"{source}: exchanges[{replayer.position}].response.body: "
                           f"{exc}") from None
    replayer.finish()
    return session.context, count, verdicts


def _check_flags(args: argparse.Namespace) -> None:
    """Flags that belong to another way of evaluating are refused, not ignored."""
    allowed = {"objects": {"namespace_labels"},
               "context": {"kubeconfig", "record", "page_size"}, "replay": set()}
    mode = next(m for m in allowed if getattr(args, m) is not None)
    for flag in ("namespace_labels", "kubeconfig", "record", "page_size"):
        if getattr(args, flag) is not None and flag not in allowed[mode]:
            raise EvalInputError(
                f"--{flag.replace('_', '-')} does not go with --{mode.removesuffix('s')}")
    if args.page_size is not None and not 1 <= args.page_size <= 10_000:
        raise EvalInputError(f"--page-size {args.page_size}: expected 1 to 10000")


def _print(evaluator: PolicyEval, verdicts: Sequence[Verdict], *, as_json: bool, selector: str,
           out: TextIO, err: TextIO) -> None:
    name = evaluator.admission.policy["metadata"]["name"]
    mode = evaluator.admission.enforcement
    if not evaluator.enabled:
        print(f"note: policy {name} is disabled: a cluster enforces nothing until it is "
              "enabled; the verdicts show what it would deny then", file=err)
    if mode is not Enforcement.DENY:
        does = ("admits what it fails with a warning" if mode is Enforcement.WARN
                else "admits what it fails and only records it in its audit log")
        print(f"note: policy {name} is in mode {mode.value}: a cluster {does}; the verdicts "
              "show it as allowed with the warning or audit annotation it would get", file=err)
    if as_json:
        json.dump({"policy": name, "enabled": evaluator.enabled, "enforcement": mode.value,
                   "namespaceSelector": selector,
                   "results": [v.as_dict() for v in verdicts]}, out, indent=2)
        out.write("\n")
        return
    print(f"policy {name}; namespaceSelector {selector}", file=err)
    for v in verdicts:
        where = f"{v.kind} {v.namespace}/{v.name}"
        if v.allowed:
            note = "" if v.matched else " (not a kind the policy matches)"
            note += " (audit annotation written)" if v.audited else ""
            print(f"allowed  {v.source}  {where}{note}", file=out)
        else:
            print(f"denied   {v.source}  {where}: {v.message}", file=out)
        for warning in v.warnings:
            print(f"         Warning: {warning}", file=out)


def _evaluate(args: argparse.Namespace, env: Mapping[str, str]
              ) -> tuple[PolicyEval, list[Verdict], str]:
    _check_flags(args)
    if args.objects is not None:
        labels = parse_labels(args.namespace_labels)
        evaluator, verdicts = evaluate_files(args.policy, args.objects, labels)
        selector = ("applied to --namespace-labels" if labels is not None else
                    f"not applied: objects are taken as in a namespace labelled "
                    f"{BOUNDARY_LABEL}={evaluator.boundary}")
        return evaluator, verdicts, selector
    spec = load_policy(args.policy)
    try:
        evaluator = PolicyEval(spec, None)
    except RenderError as exc:
        raise EvalInputError(f"{args.policy}: cannot be enforced ({exc.reason}): "
                             f"{exc}") from None
    context, count, verdicts = (_live(args, spec, evaluator, env) if args.context is not None
                                else _replay(args, spec, evaluator))
    selector = (f"applied to the labels of each namespace: context {context}, {count} "
                f"namespace(s) labelled {BOUNDARY_LABEL}={evaluator.boundary}")
    return evaluator, verdicts, selector


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None,
        env: Mapping[str, str] | None = None) -> int:
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    try:
        evaluator, verdicts, selector = _evaluate(args, env if env is not None else os.environ)
    except (EvalInputError, SessionError) as exc:
        print(f"convergerd policy eval: {exc}", file=err)
        return EXIT_USAGE
    _print(evaluator, verdicts, as_json=args.json, selector=selector, out=out, err=err)
    return EXIT_DENIED if any(not v.allowed for v in verdicts) else EXIT_ALLOWED
