# The public face (docs/design.md, "Modules"): the modules other parts of convergerd may import.
__all__ = ["faults", "fleet", "main", "resources", "status"]
