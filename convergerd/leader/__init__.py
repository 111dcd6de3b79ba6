"""Leadership: Lease arithmetic (pure) and the elector with fencing."""

# The public face (docs/design.md, "Modules"): the modules other parts of convergerd may import.
__all__ = ["elector", "lease", "shards"]
