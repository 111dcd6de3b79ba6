"""Status: the one owner of what is known about the fleet (`state`, closed: readers get its
read-only face, `reader`), phases, the database sync, the prober, the `/status` document and the
Prometheus views of it."""

# The public face (docs/design.md, "Modules"): the modules other parts of convergerd may import.
__all__ = ["admissions", "document", "listing", "metrics", "phases", "probe", "reader",
           "records", "rollouts", "state", "sync", "views"]
