"""The `policy eval` session file: written and read back, every field checked, garbage never a
traceback, and the replayer's order checks."""

from __future__ import annotations

import asyncio
import copy
import socket
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from convergerd.cli.main import main
from convergerd.cli.session import (
    Exchange,
    PolicyRef,
    Replayer,
    Session,
    SessionError,
    decode_session,
    load_session,
    policy_ref,
    session_document,
    without_managed_fields,
    write_session,
)
from tests.strategies import HOSTILE_BODIES, JSON_VALUES

SPEC = {"policyId": "p1", "boundary": "team-a", "enabled": True, "revision": 1,
        "rule": {"type": "ForbidLatestTag"}}
NAMESPACES = {"kind": "NamespaceList", "apiVersion": "v1", "metadata": {},
              "items": [{"metadata": {"name": "shop", "labels": {
                  "platform.stackship.se/boundary": "team-a"}}}]}
PODS: dict[str, Any] = {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": [
    {"metadata": {"name": "web", "namespace": "shop", "managedFields": [{"manager": "x"}]},
     "spec": {"containers": [{"name": "c", "image": "nginx:latest"}]}}]}
DISCOVERY = {"kind": "APIResourceList", "groupVersion": "v1", "resources": [
    {"name": "pods", "kind": "Pod", "namespaced": True}]}
NOT_FOUND = {"kind": "Status", "code": 404}


def session(exchanges: tuple[Exchange, ...] | None = None) -> Session:
    return Session(policy=policy_ref(SPEC), context="c0001", recorded_at="2026-12-03T12:00:00Z",
                   page_size=500, exchanges=exchanges if exchanges is not None else (
                       Exchange("GET", "/api/v1", 200, DISCOVERY),
                       Exchange("GET", "/apis/apps/v1", 404, NOT_FOUND),
                       Exchange("GET", "/apis/batch/v1", 404, NOT_FOUND),
                       Exchange("GET", "/api/v1/namespaces?labelSelector=platform.stackship.se"
                                "%2Fboundary%3Dteam-a&limit=500", 200, NAMESPACES),
                       Exchange("GET", "/api/v1/namespaces/shop/pods?limit=500", 200,
                                without_managed_fields(PODS)),
                   ))


def test_written_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    write_session(path, session())
    assert load_session(path) == session()
    assert path.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["s.yaml"]  # no temporary file left


@settings(max_examples=100, deadline=None)
@given(body=st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=4),
       text=st.text(max_size=20))
def test_any_answer_reads_back_as_it_was_recorded(
    tmp_path_factory: pytest.TempPathFactory, body: dict[str, Any], text: str
) -> None:
    # Line and paragraph separators, NEL, tabs, trailing spaces, lone surrogates: what a
    # literal block cannot hold is written quoted, and still reads back the same.
    body = body | {"text": text, "lines": "a \n\u2028b\x85\tc  \n",
                   "surrogate": "\ud800" if text else ""}
    path = tmp_path_factory.getbasetemp() / "roundtrip-session.yaml"
    write_session(path, session((Exchange("GET", "/api/v1", 200, body),)))
    assert load_session(path).exchanges[0].body == body


def test_managed_fields_are_dropped_from_the_items() -> None:
    body = without_managed_fields(PODS)
    assert "managedFields" not in body["items"][0]["metadata"]
    assert "managedFields" in PODS["items"][0]["metadata"]  # the answer itself is untouched


def test_the_policy_is_identified_by_its_spec() -> None:
    assert policy_ref(SPEC) == policy_ref(dict(reversed(SPEC.items())))
    other = policy_ref(SPEC | {"boundary": "team-b"})
    assert (other.id, other.revision) == ("p1", 1)
    assert other.spec_sha256 != policy_ref(SPEC).spec_sha256


@pytest.mark.parametrize(("edit", "words"), [
    (lambda d: d.pop("exchanges"), "the document: missing field(s) ['exchanges']"),
    (lambda d: d.update(extra=1), "the document: unknown field(s) ['extra']"),
    (lambda d: d.update(kind="Policy"), "not a policy eval session: apiVersion"),
    (lambda d: d["policy"].update(specSha256="abc"), "policy.specSha256: expected 64 lowercase"),
    (lambda d: d["policy"].update(revision=True), "policy.revision: expected an integer"),
    (lambda d: d.update(pageSize=0), "pageSize: expected an integer from 1 to 100000, got 0"),
    (lambda d: d.update(context=""), "context: expected a non-empty string"),
    (lambda d: d["exchanges"][1]["request"].update(method="POST"),
     "exchanges[1].request.method: expected GET (the evaluation only reads), got 'POST'"),
    (lambda d: d["exchanges"][1]["request"].update(path="api/v1"),
     "exchanges[1].request.path: expected a path starting with /"),
    (lambda d: d["exchanges"][2]["response"].update(body=[]),
     "exchanges[2].response.body: expected the answer's JSON text (a string), got []"),
    (lambda d: d["exchanges"][4]["response"].update(body='{"items": [NaN]}'),
     "exchanges[4].response.body: NaN is not JSON"),
    (lambda d: d["exchanges"][4]["response"].update(body="[1]"),
     "exchanges[4].response.body: expected a JSON object, got [1]"),
    (lambda d: d["exchanges"][0].pop("response"),
     "exchanges[0]: missing field(s) ['response']"),
])
def test_every_field_is_checked_and_named(edit: Any, words: str) -> None:
    doc = copy.deepcopy(session_document(session()))  # the bodies are shared constants
    edit(doc)
    with pytest.raises(SessionError) as caught:
        decode_session(doc, "s.yaml")
    assert str(caught.value).startswith("s.yaml: ")
    assert words in str(caught.value)


@settings(max_examples=100, deadline=None)
@given(data=HOSTILE_BODIES)
def test_garbage_bytes_are_a_session_error_never_a_traceback(
    tmp_path_factory: pytest.TempPathFactory, data: bytes
) -> None:
    # the bytes as a file: read bounded, loaded as bounded YAML, decoded
    target = tmp_path_factory.getbasetemp() / "garbage-session.yaml"
    target.write_bytes(data)
    with pytest.raises(SessionError):
        load_session(target)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_documents_with_any_value_anywhere_never_traceback(data: st.DataObject) -> None:
    doc = copy.deepcopy(session_document(session()))  # the bodies are shared constants
    # Replace one value somewhere in the document by anything JSON can carry.
    node: Any = doc
    while isinstance(node, dict | list) and node:
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        key = data.draw(st.sampled_from(keys))
        if data.draw(st.booleans()) or not isinstance(node[key], dict | list):
            node[key] = data.draw(JSON_VALUES)
            break
        node = node[key]
    message = ""
    try:
        decode_session(doc, "s.yaml")
    except SessionError as exc:
        message = str(exc)
    assert message == "" or message.startswith("s.yaml: ")


def replay(exchanges: tuple[Exchange, ...], *asks: str) -> Replayer:
    replayer = Replayer(session(exchanges), "s.yaml")

    async def go() -> None:
        for ask in asks:
            await replayer.get(ask, {})

    asyncio.run(go())
    return replayer


def test_the_replayer_names_the_first_difference() -> None:
    recorded = (Exchange("GET", "/api/v1", 200, {}), Exchange("GET", "/apis/apps/v1", 200, {}))
    with pytest.raises(SessionError, match=r"exchanges\[1\]: the evaluation asks GET "
                       r"/apis/batch/v1, the session recorded 'GET /apis/apps/v1'"):
        replay(recorded, "/api/v1", "/apis/batch/v1")
    with pytest.raises(SessionError, match=r"request 3 \(GET /x\) is not in the session: it "
                       r"ends after 2 exchange"):
        replay(recorded, "/api/v1", "/apis/apps/v1", "/x")
    with pytest.raises(SessionError, match=r"1 recorded exchange\(s\) the evaluation did not "
                       r"make, from exchanges\[1\]"):
        replay(recorded, "/api/v1").finish()
    replay(recorded, "/api/v1", "/apis/apps/v1").finish()


def test_replay_from_a_written_session_opens_no_connection(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_network(*args: object) -> None:
        raise AssertionError("replay opened a connection")

    for name in ("connect", "connect_ex"):
        monkeypatch.setattr(socket.socket, name, no_network)
    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    path, policy = tmp_path / "s.yaml", tmp_path / "p.yaml"
    write_session(path, session())
    policy.write_text(yaml.safe_dump({"id": "p1", "boundary": "team-a",
                                      "rule": {"type": "ForbidLatestTag"}}))
    assert main(["policy", "eval", "--policy", str(policy), "--replay", str(path)]) == 1
    out, err = capsys.readouterr()
    assert out.startswith("denied   c0001  Pod shop/web: pods \"web\" is forbidden")
    assert "context c0001, 1 namespace(s) labelled" in err


@pytest.mark.parametrize(("args", "words"), [
    (["--replay", "s.yaml", "--record", "x.yaml"], "--record does not go with --replay"),
    (["--object", "o.yaml", "--page-size", "3"], "--page-size does not go with --object"),
    (["--context", "c1", "--namespace-labels", "a=b"],
     "--namespace-labels does not go with --context"),
    (["--context", "c1", "--page-size", "0"], "--page-size 0: expected 1 to 10000"),
])
def test_flags_of_another_mode_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], words: str
) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text("{id: p1, boundary: team-a, rule: {type: ForbidLatestTag}}")
    assert main(["policy", "eval", "--policy", str(policy), *args]) == 2
    assert words in capsys.readouterr().err


def test_an_unknown_context_is_exit_2(tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    policy, kubeconfig = tmp_path / "p.yaml", tmp_path / "kubeconfig"
    policy.write_text("{id: p1, boundary: team-a, rule: {type: ForbidLatestTag}}")
    kubeconfig.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\n")
    assert main(["policy", "eval", "--policy", str(policy), "--context", "nope",
                 "--kubeconfig", str(kubeconfig), "--record", str(tmp_path / "s.yaml")]) == 2
    assert "no context named 'nope'" in capsys.readouterr().err
    assert not (tmp_path / "s.yaml").exists()


def test_policy_ref_shows_no_more_than_a_hash_prefix() -> None:
    assert str(PolicyRef("p1", 2, "a" * 64)) == "policy 'p1' revision 2 (spec sha256 " \
        "aaaaaaaaaaaa...)"
