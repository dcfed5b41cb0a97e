"""Alembic environment and versions of the allocator schema (shipped as allocator.migrations)."""
