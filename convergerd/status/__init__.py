"""Status: the one owner of what is known about the fleet (`state`), phases, the database sync, the
prober, and the Prometheus views of it."""
