"""A save's vocabulary: what it does on a cluster (`SaveAction`), what kind of fan-out it is
(`Operation`), and its unit of work (`Work`). Pure.

"Save" is the one word (docs/design.md, "Glossary"): one revision of one policy written to
every cluster concerned, at once: applied where its boundary reaches, removed where it no
longer does. The public names stay as they were (`POST /v1/policies/{id}/apply`, the
`convergerd_fanout_*` metrics, `convergerd policy apply`); the values of these enums are the
strings those faces, the logs and the database always carried.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from convergerd.core.model import ClusterId


class SaveAction(StrEnum):
    """What a save or a deletion does on one cluster (`ClusterResult.action`)."""

    APPLY = "apply"  # write the policy's revision
    REMOVE = "remove"  # delete the policy's object (out of scope, or the policy deleted)


class Operation(StrEnum):
    """A fan-out's kind (`FanoutReport.operation`, the `operation` label of the metrics)."""

    SAVE = "save"
    DELETE = "delete"


@dataclass(frozen=True, slots=True)
class Work:
    """One cluster in a save: apply the policy (reading the live object first when `read`,
    see `removal.read_first`) or remove it (the cluster left the policy's scope)."""

    cluster: ClusterId
    action: SaveAction
    read: bool = False
