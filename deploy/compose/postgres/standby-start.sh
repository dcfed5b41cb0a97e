#!/bin/sh
# The standby (runs as the postgres user). First start, with an empty data folder: copy the
# primary with pg_basebackup, streaming its WAL, and write the standby's settings (-R:
# standby.signal and primary_conninfo, with the replication slot the primary made). Then
# PostgreSQL as a hot standby whose application_name (cluster_name) is the one the
# primary's synchronous_standby_names waits for.
#
# synchronous_standby_names is empty here: the base backup copies the primary's, and a
# promoted standby must not wait for a standby of its own that does not exist (it commits
# alone until a new standby is built from it; docs/postgres-ha.md).
set -eu

if [ ! -s "$PGDATA/PG_VERSION" ]; then
    until pg_isready --quiet --host="$PRIMARY_HOST" --username=replicator; do
        sleep 1
    done
    PGPASSWORD="$(cat /run/secrets/replication_password)"
    export PGPASSWORD
    pg_basebackup --host="$PRIMARY_HOST" --username=replicator --pgdata="$PGDATA" \
        --wal-method=stream --checkpoint=fast --slot=pg_standby --write-recovery-conf \
        --no-password
    unset PGPASSWORD
fi

exec docker-entrypoint.sh postgres \
    -c cluster_name=pg_standby \
    -c hot_standby=on \
    -c synchronous_standby_names=
