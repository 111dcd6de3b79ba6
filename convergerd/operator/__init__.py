"""The in-cluster operator (`convergerd operator`): turns each Policy into a
ValidatingAdmissionPolicy and binding, and reports the Policy's status (see docs/design.md)."""
