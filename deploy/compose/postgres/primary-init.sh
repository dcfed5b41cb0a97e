#!/bin/sh
# The primary's first start (the postgres image runs /docker-entrypoint-initdb.d/*.sh once,
# when it creates the data folder, against a server on its local socket only):
#
# - `replicator`: the standby's base backup and streaming (a REPLICATION login, scram);
# - `allocator_migrator`: the role `allocator migrate` logs in as (docs/sql.md, "Who runs
#   the migrations"): CREATEROLE, owner of the `allocator` database, already a member of
#   `allocator_owner`, which is in `pg_read_all_stats` (granted here, as the superuser);
# - the standby's physical replication slot, so the primary keeps the WAL it has not had;
# - synchronous_standby_names: from the next start on, a commit returns only once the
#   standby has flushed it (I4 of docs/design.md §2 across a failover; docs/postgres-ha.md). Written with
#   ALTER SYSTEM and not reloaded, so the statements here do not wait for a standby that
#   does not exist yet.
#
# The passwords come from the compose secrets; psql reads them itself (`\set ... `cat``), so
# they appear in no command line.
set -eu

psql --set=ON_ERROR_STOP=1 --no-psqlrc --quiet \
    --username="$POSTGRES_USER" --dbname="${POSTGRES_DB:-$POSTGRES_USER}" <<'SQL'
\set replication_password `cat /run/secrets/replication_password`
\set migrator_password `cat /run/secrets/migrator_password`
CREATE ROLE replicator LOGIN REPLICATION PASSWORD :'replication_password';
CREATE ROLE allocator_migrator LOGIN CREATEROLE PASSWORD :'migrator_password';
CREATE DATABASE allocator OWNER allocator_migrator;
CREATE ROLE allocator_owner NOLOGIN;
GRANT pg_read_all_stats TO allocator_owner;
GRANT allocator_owner TO allocator_migrator;
SELECT pg_create_physical_replication_slot('pg_standby');
ALTER SYSTEM SET synchronous_standby_names = 'FIRST 1 (pg_standby)';
ALTER SYSTEM SET synchronous_commit = 'on';
SQL

# The image lets every other host in with a password (scram); replication needs its own line.
echo "host replication replicator all scram-sha-256" >> "$PGDATA/pg_hba.conf"
