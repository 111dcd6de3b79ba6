"""The HTTP API: the aiohttp server (health, readiness, metrics, status), the save and delete
handlers, the OpenAPI document."""

# The public face (docs/design.md, "Modules"): the modules other parts of convergerd may import.
__all__ = ["app", "auth", "server"]
