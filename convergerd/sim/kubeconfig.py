"""Writing the fleet's kubeconfig: one context per cluster, named by cluster id.

The file holds bearer tokens, so it is written with mode 0600 and atomically (a reader never
sees half a file: tests and the daemon may poll for it while the simulator starts).
"""

from __future__ import annotations

import base64
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml


@dataclass(frozen=True)
class KubeconfigEntry:
    name: str  # cluster id; also the context, cluster and user name
    server: str
    ca_pem: bytes
    token: str


def kubeconfig_document(entries: Iterable[KubeconfigEntry], current: str) -> dict[str, Any]:
    clusters: list[dict[str, Any]] = []
    users: list[dict[str, Any]] = []
    contexts: list[dict[str, Any]] = []
    for e in entries:
        ca = base64.b64encode(e.ca_pem).decode("ascii")
        clusters.append(
            {"name": e.name, "cluster": {"server": e.server, "certificate-authority-data": ca}}
        )
        users.append({"name": e.name, "user": {"token": e.token}})
        contexts.append({"name": e.name, "context": {"cluster": e.name, "user": e.name}})
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "preferences": {},
        "clusters": clusters,
        "users": users,
        "contexts": contexts,
        "current-context": current,
    }


def write_kubeconfig(path: Path, entries: Iterable[KubeconfigEntry], current: str) -> None:
    """Write atomically with mode 0600 (the tokens are credentials)."""
    doc = kubeconfig_document(entries, current)
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    text = yaml.dump(doc, Dumper=dumper, sort_keys=False, default_flow_style=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        # mkstemp already creates the file 0600; say so explicitly rather than rely on it.
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
