"""Operators and the pool: pausing claims, resetting it after a restore."""
