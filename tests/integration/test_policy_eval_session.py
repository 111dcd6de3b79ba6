"""`convergerd policy eval --context` against the simulator, `--record` of its API exchanges,
and `--replay` of them with the simulator stopped: the same report and exit code; sessions
that do not match (another policy, edited by hand, truncated, garbage) exit 2 with the reason.
"""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml

from convergerd.cli.main import main
from tests.fixtures.fleet import SimProcess, start_sim_process, stop_sim_process

BOUNDARY_LABEL = "platform.stackship.se/boundary"
LATEST: dict[str, Any] = {"type": "ForbidLatestTag"}


def pod(name: str, image: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": image}]}}


def populate(sim: SimProcess) -> None:
    """Two namespaces of boundary team-a (four pods and a Deployment, three violating), one
    of team-b (a violating pod that the evaluation must not see)."""
    sync: Any = kubernetes  # the generated stubs disagree with dict bodies
    api = sync.config.new_client_from_config(config_file=str(sim.kubeconfig_path),
                                             context="c0001")
    with api:
        core = sync.client.CoreV1Api(api)
        for name, boundary in (("team-a-apps", "team-a"), ("team-a-jobs", "team-a"),
                               ("team-b-apps", "team-b")):
            core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {
                "name": name, "labels": {BOUNDARY_LABEL: boundary}}})
        for namespace, body in (
            ("team-a-apps", pod("web", "nginx:1.27")),
            ("team-a-apps", pod("cache", "redis:latest")),
            ("team-a-apps", pod("api", "registry.example.com/api@sha256:" + "a" * 64)),
            ("team-a-jobs", pod("batch", "busybox")),
            ("team-b-apps", pod("other", "nginx:latest")),
        ):
            core.create_namespaced_pod(namespace, body)
        deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                      "metadata": {"name": "worker"}, "spec": {
                          "selector": {"matchLabels": {"app": "worker"}},
                          "template": {"metadata": {"labels": {"app": "worker"}},
                                       "spec": pod("x", "worker:latest")["spec"]}}}
        sync.client.AppsV1Api(api).create_namespaced_deployment("team-a-jobs", deployment)
        # what the session must leave out: the cluster keeps managedFields on every object
        assert core.read_namespaced_pod("web", "team-a-apps").metadata.managed_fields


@dataclass(frozen=True)
class Recorded:
    tmp: Path
    policy: Path
    session: Path
    kubeconfig: Path
    live: tuple[int, str, str]  # exit code, stdout, stderr of the recording run


def cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    """Record against a simulator, then stop it: every replay runs with no cluster."""
    tmp = tmp_path_factory.mktemp("session")
    policy = tmp / "policy.yaml"
    policy.write_text(yaml.safe_dump({"id": "p1", "boundary": "team-a", "rule": LATEST}))
    session = tmp / "session.yaml"
    sim = start_sim_process(tmp, clusters=1)
    try:
        populate(sim)
        live = cli("policy", "eval", "--policy", str(policy), "--context", "c0001",
                   "--kubeconfig", str(sim.kubeconfig_path), "--page-size", "2",
                   "--record", str(session))
    finally:
        stop_sim_process(sim)
    return Recorded(tmp, policy, session, sim.kubeconfig_path, live)


def test_record_then_replay_with_the_cluster_gone(recorded: Recorded) -> None:
    code, out, err = recorded.live
    assert code == 1, err
    assert out.splitlines() == [
        "allowed  c0001  Pod team-a-apps/api",
        "denied   c0001  Pod team-a-apps/cache: pods \"cache\" is forbidden: "
        "ValidatingAdmissionPolicy 'stackship-p1' with binding 'stackship-p1' denied request: "
        "image(s) 'redis:latest' use the tag 'latest', which changes under you: pin a version "
        "tag (e.g. nginx:1.27.3) or a digest (nginx@sha256:...)",
        "allowed  c0001  Pod team-a-apps/web",
        "denied   c0001  Pod team-a-jobs/batch: pods \"batch\" is forbidden: "
        "ValidatingAdmissionPolicy 'stackship-p1' with binding 'stackship-p1' denied request: "
        "image(s) 'busybox' have no tag or digest, which means tag 'latest': pin a version "
        "tag (e.g. nginx:1.27.3) or a digest (nginx@sha256:...)",
        "denied   c0001  Deployment team-a-jobs/worker: deployments.apps \"worker\" is "
        "forbidden: ValidatingAdmissionPolicy 'stackship-p1' with binding 'stackship-p1' "
        "denied request: image(s) 'worker:latest' use the tag 'latest', which changes under "
        "you: pin a version tag (e.g. nginx:1.27.3) or a digest (nginx@sha256:...)",
    ]
    assert "context c0001, 2 namespace(s) labelled platform.stackship.se/boundary=team-a" in err

    text = recorded.session.read_text()
    assert recorded.session.stat().st_mode & 0o777 == 0o600
    assert '"managedFields"' not in text
    doc = yaml.safe_load(text)
    assert (doc["apiVersion"], doc["kind"]) == ("convergerd.stackship.se/v1alpha1", "EvalSession")
    paths = [e["request"]["path"] for e in doc["exchanges"]]
    # page size 2: three pods in team-a-apps take two pages, the second asked by `continue`
    pod_pages = [p for p in paths if p.startswith("/api/v1/namespaces/team-a-apps/pods")]
    assert len(pod_pages) == 2
    assert "continue=" in pod_pages[1]
    assert not any("team-b" in p for p in paths)

    replay = ["policy", "eval", "--policy", str(recorded.policy), "--replay",
              str(recorded.session)]
    assert cli(*replay) == recorded.live
    code, out, _ = cli(*replay, "--json")
    assert code == 1
    assert [r["allowed"] for r in json.loads(out)["results"]] == [True, False, True, False,
                                                                  False]


def corrupt(recorded: Recorded, name: str, edit: Any) -> Path:
    doc = yaml.safe_load(recorded.session.read_text())
    path = recorded.tmp / name
    result = edit(doc)
    path.write_bytes(result if isinstance(result, bytes) else yaml.safe_dump(doc).encode())
    return path


def _edit_path(doc: dict[str, Any]) -> None:
    doc["exchanges"][4]["request"]["path"] = "/api/v1/namespaces/kube-system/pods?limit=2"


def _truncate(doc: dict[str, Any]) -> None:
    del doc["exchanges"][-1]


def _extra(doc: dict[str, Any]) -> None:
    doc["exchanges"].append(doc["exchanges"][0])


def _status(doc: dict[str, Any]) -> None:
    doc["exchanges"][0]["response"]["status"] = "200"


def _items(doc: dict[str, Any]) -> None:
    response = doc["exchanges"][3]["response"]
    response["body"] = json.dumps(json.loads(response["body"]) | {"items": "none"})


@pytest.mark.parametrize(("edit", "words"), [
    (_edit_path, "exchanges[4]: the evaluation asks GET /api/v1/namespaces/team-a-apps/pods?"
                 "limit=2, the session recorded 'GET /api/v1/namespaces/kube-system/pods?"
                 "limit=2'"),
    (_truncate, "it ends after"),
    (_extra, "1 recorded exchange(s) the evaluation did not make"),
    (_status, "exchanges[0].response.status: expected an integer from 100 to 599, got '200'"),
    (_items, "list answer: items: expected a list"),
    (lambda doc: b"\x00\xff garbage", "not UTF-8"),
    (lambda doc: b"exchanges: [", "not valid YAML"),
])
def test_a_session_that_does_not_match_is_exit_2_with_the_reason(
    recorded: Recorded, edit: Any, words: str, request: pytest.FixtureRequest,
) -> None:
    path = corrupt(recorded, f"bad-{request.node.callspec.id}.yaml", edit)
    code, out, err = cli("policy", "eval", "--policy", str(recorded.policy), "--replay",
                         str(path))
    assert (code, out) == (2, "")
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"convergerd policy eval: {path}")
    assert words in err


def test_a_file_cut_in_an_answer_is_exit_2(recorded: Recorded) -> None:
    text = recorded.session.read_text()
    cut = recorded.tmp / "cut.yaml"
    cut.write_text(text[: text.index('"items"', text.index("team-a-apps/pods"))])
    code, out, err = cli("policy", "eval", "--policy", str(recorded.policy), "--replay",
                         str(cut))
    assert (code, out) == (2, "")
    assert "response.body: not JSON" in err
    assert "the recorded answer was cut short (a truncated file) or edited" in err


def test_another_policy_is_refused(recorded: Recorded) -> None:
    other = recorded.tmp / "other.yaml"
    other.write_text(yaml.safe_dump({"id": "p1", "boundary": "team-a", "rule": {
        "type": "AllowedRegistries", "registries": ["registry.example.com"]}}))
    code, out, err = cli("policy", "eval", "--policy", str(other), "--replay",
                         str(recorded.session))
    assert (code, out) == (2, "")
    assert "recorded for policy 'p1' revision 1 (spec sha256" in err
    assert f"--policy {other} is policy 'p1' revision 1" in err


def test_a_cluster_that_cannot_be_read_is_exit_2_and_no_session(recorded: Recorded) -> None:
    session = recorded.tmp / "down.yaml"
    code, out, err = cli("policy", "eval", "--policy", str(recorded.policy), "--context",
                         "c0001", "--kubeconfig", str(recorded.kubeconfig), "--record",
                         str(session))
    assert (code, out) == (2, "")
    assert err == "convergerd policy eval: context 'c0001': connection refused\n"
    assert not session.exists()
