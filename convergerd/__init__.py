"""convergerd: delivers tenants' admission policies into every cluster they cover."""

__version__ = "0.1.0"
