"""What the workload cache keeps: the kinds admission judges, only what the rules read, and
within its memory budget for 10,000 pods."""

from __future__ import annotations

import gc
import json
import logging
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from convergerd.core.decode import parse_object
from convergerd.kube.api import KubeObject
from convergerd.kube.watch import object_key
from convergerd.operator.workloads import (
    IMAGE_BYTES,
    IMAGE_MAX_CHARS,
    OBJECT_BYTES,
    OBJECT_MAX_BYTES,
    PART_BYTES,
    REFUSED_BYTES,
    SLIM_BYTES_BUDGET,
    WORKLOAD_KINDS,
    cost,
    images,
    refused,
    slim,
)
from tests.strategies import JSON_VALUES

PODS = 10_000
ROOT = Path(__file__).resolve().parents[2]


def test_the_kinds_are_those_admission_judges() -> None:
    assert [(r.group, r.plural, kind) for r, kind in WORKLOAD_KINDS] == [
        ("", "pods", "Pod"), ("apps", "deployments", "Deployment"),
        ("apps", "replicasets", "ReplicaSet"), ("apps", "statefulsets", "StatefulSet"),
        ("apps", "daemonsets", "DaemonSet"), ("batch", "jobs", "Job"),
        ("batch", "cronjobs", "CronJob")]
    assert all(r.namespaced for r, _ in WORKLOAD_KINDS)


def pod_json(i: int) -> bytes:
    """A pod as a real apiserver lists it: managedFields, annotations, status and all."""
    fields = {"f:metadata": {"f:labels": {".": {}, "f:app": {}}},
              "f:spec": {"f:containers": {'k:{"name":"api"}': {".": {}, "f:image": {}}}}}
    pod = {
        "metadata": {
            "name": f"api-7f9c-{i:05d}", "namespace": "team-a-web",
            "uid": f"0d9f1c2e-5a7b-4c3d-9e8f-{i:012d}", "resourceVersion": str(1000 + i),
            "generation": 1, "creationTimestamp": "2026-12-03T12:00:00Z",
            "labels": {"app": "api", "pod-template-hash": "7f9c", "team": "a",
                       "example.com/cost-center": "cc-1"},
            "annotations": {"kubectl.kubernetes.io/restartedAt": "2026-12-01T00:00:00Z"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                 "name": "api-7f9c", "uid": "u", "controller": True}],
            "managedFields": [{"manager": "kube-controller-manager", "operation": "Update",
                               "apiVersion": "v1", "fieldsType": "FieldsV1",
                               "fieldsV1": fields}],
        },
        "spec": {
            "containers": [
                {"name": "api", "image": "registry.example.com/team-a/api:1.4.2",
                 "ports": [{"containerPort": 8080}],
                 "resources": {"requests": {"cpu": "100m"}}},
                {"name": "proxy", "image": "registry.example.com/envoy:1.31"}],
            "nodeName": "n1", "serviceAccountName": "default",
            "tolerations": [{"key": "k", "operator": "Exists"}],
        },
        "status": {"phase": "Running", "podIP": "10.0.0.1",
                   "conditions": [{"type": "Ready", "status": "True"}]},
    }
    return json.dumps(pod).encode()


def test_slim_keeps_only_what_the_rules_read() -> None:
    pod = parse_object(pod_json(1), "pod")
    assert slim("Pod", pod) == {
        "kind": "Pod",
        "metadata": {"name": "api-7f9c-00001", "namespace": "team-a-web",
                     "resourceVersion": "1001",
                     "labels": {"app": "api", "pod-template-hash": "7f9c", "team": "a",
                                "example.com/cost-center": "cc-1"}},
        "images": ("registry.example.com/team-a/api:1.4.2", "registry.example.com/envoy:1.31"),
    }


def test_images_are_read_where_the_rendered_cel_reads_them() -> None:
    spec = {"containers": [{"image": "a:1"}, {"name": "no-image"}],
            "initContainers": [{"image": "b:1"}], "ephemeralContainers": [{"image": "c:1"}]}
    assert images("Pod", {"spec": spec}) == ("a:1", "b:1", "c:1")
    assert images("Deployment", {"spec": {"template": {"spec": spec}}}) == ("a:1", "b:1", "c:1")
    assert images("CronJob", {"spec": {"jobTemplate": {"spec": {"template": {"spec": spec}}}}}) \
        == ("a:1", "b:1", "c:1")
    assert images("Job", {"spec": {}}) == ()
    assert images("Pod", {}) == ()
    kept = slim("Pod", {"metadata": {"name": "p", "labels": None}, "spec": {"containers": {}}})
    assert kept is not None
    assert kept["invalid"] == {"labels": "metadata.labels is not a map",
                               "images": "the pod spec's containers is not a list"}


def test_the_cache_holds_10000_pods_within_its_budget() -> None:
    raw = [pod_json(i) for i in range(PODS)]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        cache: dict[str, KubeObject] = {}
        for body in raw:
            # Decoded one at a time as a list page would be, then slimmed: the full object
            # is garbage at once, only the slim one is kept.
            kept: Any = slim("Pod", parse_object(body, "pod") | {"kind": "Pod"})
            key = object_key(kept, namespaced=True)
            assert key is not None
            cache[key] = kept
        gc.collect()
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    per_object = used / PODS
    charged = sum(map(cost, cache.values()))
    figure = (f"workload cache: {PODS} pods, {used / 2**20:.1f} MiB, {per_object:.0f} bytes "
              f"per pod (budget {SLIM_BYTES_BUDGET}; charged {charged / PODS:.0f})")
    logging.getLogger(__name__).warning("%s", figure)
    assert len(cache) == PODS
    assert per_object <= SLIM_BYTES_BUDGET, figure
    # The cache's accounting is an upper bound of what it holds: its budget bounds memory.
    assert used <= charged, figure


# Any shape a cluster may send where the cache looks: metadata, labels, the pod spec and its
# containers. Admission judges each kind by its own path to the pod spec.
_CONTAINERS = st.lists(st.fixed_dictionaries({}, optional={"image": JSON_VALUES | st.text()})
                       | JSON_VALUES, max_size=3) | JSON_VALUES
_POD_SPEC = st.fixed_dictionaries({}, optional={"containers": _CONTAINERS,
                                               "initContainers": _CONTAINERS}) | JSON_VALUES
HOSTILE_OBJECTS = st.fixed_dictionaries({}, optional={
    "metadata": st.fixed_dictionaries({}, optional={
        "name": st.text(max_size=8) | JSON_VALUES, "namespace": JSON_VALUES,
        "labels": st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=3) | JSON_VALUES,
    }) | JSON_VALUES,
    "spec": st.fixed_dictionaries({}, optional={
        "containers": _CONTAINERS,
        "template": st.fixed_dictionaries({}, optional={"spec": _POD_SPEC}) | JSON_VALUES,
        "jobTemplate": JSON_VALUES,
    }) | JSON_VALUES,
})


@given(st.sampled_from([kind for _, kind in WORKLOAD_KINDS]), HOSTILE_OBJECTS)
def test_any_object_slims_to_what_the_rules_read_or_nothing_never_an_exception(
    kind: str, obj: dict[str, Any]
) -> None:
    kept = slim(kind, obj)
    if kept is None:
        return  # no name: not cached
    assert set(kept) <= {"kind", "metadata", "images", "invalid", "cut"}
    # Bounded whatever was sent (the name and namespace are bounded by the response cap).
    meta = kept["metadata"]
    names = sum(len(v) for v in (meta["name"], meta.get("namespace"),
                                 meta.get("resourceVersion")) if isinstance(v, str))
    assert cost(kept) <= OBJECT_BYTES + OBJECT_MAX_BYTES + names + 2 * PART_BYTES + 4 * (
        IMAGE_BYTES + 1024)
    assert isinstance(kept["metadata"]["name"], str)
    assert ("images" in kept) != ("images" in kept.get("invalid", {}))
    assert all(isinstance(i, str) for i in kept.get("images", ()))


def wide(containers: int, image_chars: int, labels: int = 0) -> dict[str, Any]:
    return {"metadata": {"name": "wide", "namespace": "team-b",
                         "labels": {f"l{i:05d}": "v" * 60 for i in range(labels)}},
            "spec": {"template": {"spec": {"containers": [
                {"image": f"r.example.com/{i:04d}/" + "x" * (image_chars - 20)}
                for i in range(containers)]}}}}


def test_an_image_longer_than_any_valid_reference_is_not_kept_and_said() -> None:
    kept = slim("Deployment", wide(1400, 600))  # 840,000 characters of images
    assert kept is not None
    assert kept["images"] == ()
    assert kept["cut"]["images"].startswith(
        "1400 image(s) longer than 512 characters (no valid image reference is) not kept, the "
        "first 'r.example.com/0000/xxx")
    assert kept["cut"]["images"].endswith("; 0 of 1400 kept")
    assert cost(kept) < OBJECT_BYTES + 1024


def test_labels_and_images_past_the_object_budget_are_not_kept_and_said() -> None:
    kept = slim("Deployment", wide(200, IMAGE_MAX_CHARS, labels=20))
    assert kept is not None
    labels, found = kept["metadata"]["labels"], kept["images"]
    assert len(labels) == 20  # 20 x (320 + 66) bytes fit
    assert 0 < len(found) < 200
    assert found == images("Deployment", wide(200, IMAGE_MAX_CHARS))[:len(found)]  # in order
    assert kept["cut"]["images"].startswith(f"{200 - len(found)} image(s) past the 16384 bytes")
    assert "labels" not in kept["cut"]
    many = slim("Pod", {"metadata": {"name": "p", "labels": {
        f"k{i:05d}": "v" for i in range(1000)}}})
    assert many is not None
    assert many["cut"]["labels"].startswith(f"{len(many['metadata']['labels'])} of 1000 labels")
    assert cost(many) <= OBJECT_BYTES + OBJECT_MAX_BYTES + 1024


def test_a_refused_object_is_a_stub_that_costs_little() -> None:
    kept = slim("Deployment", wide(20, 400))
    assert kept is not None
    stub = refused("Deployment", kept)
    assert stub == {"kind": "Deployment", "refused": True,
                    "metadata": {"name": "wide", "namespace": "team-b", "resourceVersion": None}}
    assert cost(stub) == REFUSED_BYTES + len("wide") + len("team-b")
    assert cost(stub) < cost(kept)


# Run in a fresh interpreter: the intern table is the process's, and a doubling of it (its
# cost grown by whatever earlier tests interned) would be charged to the few objects measured.
_MEASURE = """
import gc, json, sys, tracemalloc
from convergerd.core.decode import parse_object
from convergerd.kube.watch import object_key
from convergerd.operator.workloads import cost, slim
labels, images, chars, count = map(int, sys.argv[1:])
def shaped(i):  # every label and image its own string: nothing for interning to share
    return json.dumps({"metadata": {
        "name": f"p-{i:06d}", "namespace": "team-a", "resourceVersion": str(i),
        "labels": {f"example.com/k{j}-{i}": f"v{j}-{i}" for j in range(labels)}},
        "spec": {"containers": [{"image": f"r.example.com/{j}-{i}:" + "1" * chars}
                                for j in range(images)]}}).encode()
raw = [shaped(i) for i in range(count)]
slim("Pod", parse_object(shaped(-1), "pod"))  # warm caches
gc.collect()
tracemalloc.start()
before = tracemalloc.get_traced_memory()[0]
cache = {}
for body in raw:
    kept = slim("Pod", parse_object(body, "pod"))
    cache[object_key(kept, namespaced=True)] = kept
gc.collect()
used = tracemalloc.get_traced_memory()[0] - before
print(json.dumps([used, sum(map(cost, cache.values()))]))
"""


@pytest.mark.parametrize(("labels", "images", "image_chars", "count"), [
    (4, 2, 20, 3000), (8, 0, 20, 3000), (150, 0, 20, 200), (0, 8, 20, 3000),
    (0, 200, 1, 200), (0, 25, 480, 200), (0, 100, 600, 200)])
def test_no_shape_of_object_holds_more_than_it_is_charged(
        labels: int, images: int, image_chars: int, count: int) -> None:
    out = subprocess.run([sys.executable, "-c", _MEASURE, str(labels), str(images),
                          str(image_chars), str(count)], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    used, charged = json.loads(out.stdout)
    assert used <= charged, f"{used / count:.0f} bytes held, {charged / count:.0f} charged"
