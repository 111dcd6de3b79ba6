"""The pure core: policies and their validation, the Policy object, what to apply, what happened,
error classes, decoding of what comes from outside, row types. Imports no I/O library."""

# The public face (docs/design.md, "Modules"): the modules other parts of convergerd may import.
__all__ = [
    "decode", "errors", "exceptions", "facts", "gates", "model", "plan", "removal", "render",
    "report", "revisions", "rollout", "rows", "save", "shards", "shown", "spread", "tokens",
]
