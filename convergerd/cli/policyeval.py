"""`convergerd policy eval --policy FILE --object FILE...`: a policy's verdict on objects,
offline.

The policy is rendered exactly as the in-cluster operator renders it
(`convergerd.operator.admission.render_admission`) and evaluated with the simulator's
admission evaluator (`convergerd.sim.vap`): the same CEL runtime and the same matching as a
simulated cluster, so the verdict and message are the ones `kubectl create` would get there.

Namespaces: without `--namespace-labels` every object is evaluated as if it were in a
namespace of the policy's boundary (the binding's namespaceSelector is then met by
construction); with it, the selector is applied to those labels, as a cluster would.
Objects are taken as created (operation CREATE).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from convergerd.core.errors import BadFile, ConvergerdError
from convergerd.core.shown import shown
from convergerd.files import read_bounded
from convergerd.operator.admission import BOUNDARY_LABEL, RenderError, render_admission
from convergerd.store.yamlfile import load_yaml_documents

EXIT_ALLOWED = 0
EXIT_DENIED = 1
EXIT_USAGE = 2
MAX_FILE_BYTES = 4 * 1024 * 1024
MAX_OBJECTS = 10_000
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

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "source": self.source, "kind": self.kind, "namespace": self.namespace,
            "name": self.name, "allowed": self.allowed, "matched": self.matched,
        }
        if not self.allowed:
            out |= {"message": self.message, "reason": self.reason, "code": self.code}
        return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policy", type=Path, required=True,
                        help="a Policy object, or one policy entry of an import file (YAML/JSON)")
    parser.add_argument("--object", type=Path, required=True, nargs="+", dest="objects",
                        metavar="FILE", help="objects to evaluate: YAML (several documents) "
                        "or JSON, or a List")
    parser.add_argument("--namespace-labels", metavar="K=V,...",
                        help="labels of the objects' namespace (default: a namespace of the "
                        "policy's boundary)")
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
    unknown = set(doc) - {"id", "boundary", "enabled", "rule"}
    if unknown:
        raise EvalInputError(f"{source}: unknown field(s) in the policy entry: "
                             f"{shown(sorted(map(str, unknown)))}")
    return {"policyId": doc.get("id"), "boundary": doc.get("boundary"),
            "enabled": doc.get("enabled", True), "revision": 1, "rule": doc.get("rule")}


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
        from convergerd.sim import vap

        self._vap = vap
        self.admission = render_admission(spec)
        self.boundary = str(spec["boundary"])
        self.enabled = spec.get("enabled", True) is not False
        self._namespace_labels = namespace_labels
        self._evaluator = vap.PolicyEvaluator()

    def verdict(self, source: str, obj: Mapping[str, Any]) -> Verdict:
        vap = self._vap
        meta = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
        assert isinstance(meta, Mapping)
        kind, api_version = str(obj.get("kind")), str(obj.get("apiVersion", ""))
        name = str(meta.get("name") or meta.get("generateName") or "")
        namespace = str(meta.get("namespace") or "default")
        plural = _RESOURCES.get((api_version, kind))
        if plural is None:
            return Verdict(source, kind, namespace, name, allowed=True, matched=False)
        group, _, version = api_version.rpartition("/")
        labels = dict(self._namespace_labels) if self._namespace_labels is not None \
            else {BOUNDARY_LABEL: self.boundary}
        labels["kubernetes.io/metadata.name"] = namespace
        ns_obj = {"apiVersion": "v1", "kind": "Namespace",
                  "metadata": {"name": namespace, "labels": labels}}
        attrs = vap.Attributes(
            operation="CREATE", group=group, version=version, resource=plural, kind=kind,
            namespace=namespace, name=name, object=dict(obj) | {"metadata": dict(meta) | {
                "namespace": namespace}}, old_object=None,
        )
        denial = self._evaluator.first_denial(
            [self.admission.policy], [self.admission.binding], attrs, namespace=ns_obj
        )
        if denial is None:
            return Verdict(source, kind, namespace, name, allowed=True)
        error = vap.denied(attrs, denial)
        return Verdict(source, kind, namespace, name, allowed=False, message=error.message,
                       reason=error.reason, code=error.code)


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


def _print(evaluator: PolicyEval, verdicts: Sequence[Verdict], *, as_json: bool,
           namespace_labels: Mapping[str, str] | None, out: TextIO, err: TextIO) -> None:
    name = evaluator.admission.policy["metadata"]["name"]
    selector = ("applied to --namespace-labels" if namespace_labels is not None else
                f"not applied: objects are taken as in a namespace labelled "
                f"{BOUNDARY_LABEL}={evaluator.boundary}")
    if not evaluator.enabled:
        print(f"note: policy {name} is disabled: a cluster enforces nothing until it is "
              "enabled; the verdicts show what it would deny then", file=err)
    if as_json:
        json.dump({"policy": name, "enabled": evaluator.enabled, "namespaceSelector": selector,
                   "results": [v.as_dict() for v in verdicts]}, out, indent=2)
        out.write("\n")
        return
    print(f"policy {name}; namespaceSelector {selector}", file=err)
    for v in verdicts:
        where = f"{v.kind} {v.namespace}/{v.name}"
        if v.allowed:
            note = "" if v.matched else " (not a kind the policy matches)"
            print(f"allowed  {v.source}  {where}{note}", file=out)
        else:
            print(f"denied   {v.source}  {where}: {v.message}", file=out)


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    try:
        labels = parse_labels(args.namespace_labels)
        evaluator, verdicts = evaluate_files(args.policy, args.objects, labels)
    except EvalInputError as exc:
        print(f"convergerd policy eval: {exc}", file=err)
        return EXIT_USAGE
    _print(evaluator, verdicts, as_json=args.json, namespace_labels=labels, out=out, err=err)
    return EXIT_DENIED if any(not v.allowed for v in verdicts) else EXIT_ALLOWED
