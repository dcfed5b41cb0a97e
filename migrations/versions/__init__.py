"""Alembic versions; each executes its SQL from ../sql/<revision>/."""
