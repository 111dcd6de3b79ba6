"""The HTTP API: the aiohttp server (health, readiness, metrics, status), the save and delete
handlers, the OpenAPI document."""
