"""Status: the one owner of what is known about the fleet (`state`), phases, the database sync, the
prober, and the Prometheus views of it."""

# The public face (docs/design.md, "Modules"): the modules other parts of convergerd may import.
__all__ = ["listing", "metrics", "phases", "probe", "records", "state", "sync", "views"]
