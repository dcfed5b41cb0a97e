"""Alembic environment for the allocator schema.

Rules: the database URL comes from the Alembic config's attributes (set by
``allocator.migrate``), never from a file in the repository; libpq opens the connection
(``allocator.migrate.engine``), so multi-host URLs work; migrations run online only, one
transaction per run (PostgreSQL DDL is transactional, so a failed upgrade leaves nothing
half-done). The version table lives in the ``public`` schema so that dropping ``allocator``
on downgrade is clean. Around the migrations, in their transaction,
``allocator.postgres.migrate`` lets the node and operator roles read that table and records
the compatibility marker in its comment (docs/upgrades.md).
"""

from __future__ import annotations

from alembic import context

from allocator.postgres import migrate


def run_migrations_online() -> None:
    url = context.config.attributes.get(migrate.URL_ATTRIBUTE)
    if not url:
        raise RuntimeError("no database URL given to the allocator migrations")
    engine = migrate.engine(url)
    with engine.connect() as connection:
        context.configure(connection=connection, transaction_per_migration=False)
        driver = connection.connection.driver_connection
        with context.begin_transaction():
            migrate.before_migrations(driver, context.get_revision_argument())
            context.run_migrations()
            migrate.after_migrations(driver)
    engine.dispose()


if context.is_offline_mode():
    raise RuntimeError("offline (SQL script) mode is not supported; run `allocator migrate`")
run_migrations_online()
