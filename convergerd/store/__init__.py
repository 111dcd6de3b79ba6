"""The policy database (PostgreSQL through asyncpg): schema migrations (`schema`), the `Store`
the daemon reads and records through (`store`; a round's rows and how they are written:
`records`; values PostgreSQL can hold: `values`; errors classified: `errors`), and
`convergerd import` (`importer`)."""

# The public face (docs/design.md, "Modules"): the modules other parts of convergerd may import.
__all__ = ["exceptions", "importer", "notify", "revisions", "schema", "store", "tenants",
           "yamlfile"]
