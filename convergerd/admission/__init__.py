"""Admission policies, one evaluator for all: a Policy rendered as a ValidatingAdmissionPolicy
and binding (`render`), that CEL evaluated as kube-apiserver does (`evaluate`, on `cel` and
`labels`), and the rule judged in Python over the operator's slim objects (`verdict`). The
operator, `convergerd policy eval` and the simulator's admission all use it (see
docs/design.md)."""

# The public face (docs/design.md, "Modules"): the modules other parts of convergerd may import.
__all__ = ["evaluate", "exceptions", "labels", "render", "verdict"]
