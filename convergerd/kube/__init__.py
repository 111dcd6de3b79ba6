# The public face (docs/design.md, "Modules"): the modules other parts of convergerd may import.
__all__ = ["api", "client", "kubeconfig", "objects", "registry", "watch"]
