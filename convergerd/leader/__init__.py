"""Leadership: Lease arithmetic (pure) and the elector with fencing."""
