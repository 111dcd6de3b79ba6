"""The in-cluster operator (`convergerd operator`): turns each Policy into a
ValidatingAdmissionPolicy and binding, and reports the Policy's status (see docs/design.md)."""

# The public face (docs/design.md, "Modules"): the modules other parts of convergerd may import.
__all__ = ["main", "reconcile"]
