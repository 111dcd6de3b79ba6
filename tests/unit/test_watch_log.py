"""A cluster that lists thousands of objects without a name writes a few warnings, not one
per object (a hand-written list API)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable

import pytest

from convergerd.kube.api import KubeObject, ObjectList, Resource, WatchEvent
from convergerd.kube.watch import Informer

POLICIES = Resource("platform.stackship.se", "v1alpha1", "policies")


class NamelessLister:
    async def list_objects(self, resource: Resource, *, label_selector: str | None,
                           timeout_s: float,
                           transform: Callable[[KubeObject], KubeObject | None] | None = None,
                           step_past: bool = False,
                           ) -> ObjectList:
        items: list[KubeObject] = [{"metadata": {}} for _ in range(5_000)]
        items.append({"metadata": {"name": "real", "resourceVersion": "1"}})
        return ObjectList(items=items, resource_version="1", requests=1)

    def watch(self, resource: Resource, *, resource_version: str, label_selector: str | None,
              timeout_s: float) -> AsyncIterator[WatchEvent]:
        raise AssertionError("not watched here")


async def test_nameless_objects_are_left_out_with_a_few_lines(
    caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="convergerd.kube.watch")
    informer = Informer(NamelessLister(), POLICIES, request_timeout_s=1)
    await informer.relist()
    await informer.relist()
    assert list(informer.objects) == ["real"]
    lines = [r.getMessage() for r in caplog.records if r.name == "convergerd.kube.watch"]
    assert 1 <= len(lines) <= 5, lines[:10]
    assert all("has no name" in line for line in lines)
