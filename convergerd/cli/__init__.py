"""The command line: `convergerd COMMAND` and its subcommands."""

# The public face (docs/design.md, "Modules"): the modules other parts of convergerd may import.
__all__ = ["main"]
