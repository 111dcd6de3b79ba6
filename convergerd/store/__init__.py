"""The policy database (PostgreSQL through asyncpg): schema migrations (`schema`), the `Store`
the daemon reads and records through (`store`), and `convergerd import` (`importer`)."""
