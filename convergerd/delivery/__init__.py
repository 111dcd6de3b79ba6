"""Delivery: one engine that applies policies to clusters under a fence and a deadline (rounds and
saves), the round loop, saves on database notifications."""
