"""Delivery: one engine that applies policies to clusters under a fence and a deadline (rounds and
saves), the round loop, saves on database notifications."""

# The public face (docs/design.md, "Modules"): the modules other parts of convergerd may import.
__all__ = ["apply", "fanout", "lapse", "listener", "rollouts", "rounds", "spread"]
