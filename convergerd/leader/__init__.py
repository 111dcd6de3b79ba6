"""Leadership: the shard set (the one model), the elector with fencing, Lease arithmetic (pure)."""

# The public face (docs/design.md, "Modules"): the modules other parts of convergerd may import.
__all__ = ["elector", "lease", "shards"]
