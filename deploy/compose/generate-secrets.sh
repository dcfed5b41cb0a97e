#!/bin/sh
# Replaces the EXAMPLE secrets under secrets/ with random ones, one value per file,
# consistently: the node's and the migrator's database passwords appear both alone (for
# PostgreSQL, which sets them) and inside the URLs that log in with them. Run it before the
# first `docker compose up`: the passwords are set in PostgreSQL when its data volume is
# created (README.md says how to change them later).
#
# The files are world-readable (0644) on purpose: Compose without Swarm mounts a file secret
# as it is, and the containers read it as their own users (the node's 10001, postgres,
# grafana). Keep the folder itself private (0700) on a shared host.
set -eu

cd "$(dirname "$0")/secrets"
umask 022

random() {
    # 32 characters from [A-Za-z0-9]: safe in a URL, in SQL and as a shell word.
    LC_ALL=C tr -dc 'A-Za-z0-9' </dev/urandom | head -c 32
}

node_db_password=$(random)
migrator_password=$(random)
hosts="pg-primary:5432,pg-standby:5432"
query="target_session_attrs=read-write"

printf '%s\n' "$(random)" >postgres_password
printf '%s\n' "$(random)" >replication_password
printf '%s\n' "$migrator_password" >migrator_password
printf '%s\n' "postgresql://allocator_migrator:$migrator_password@$hosts/allocator?$query" \
    >migrate_database_url
printf '%s\n' "$node_db_password" >node_db_password
printf '%s\n' "postgresql://allocator_node_login:$node_db_password@$hosts/allocator?$query" \
    >node_database_url
printf '%s\n' "$(random)" >app_db_password
printf '%s\n' "allocator:$(random)" >zookeeper_auth
printf '%s\n' "$(random)" >admin_token
printf '%s\n' "$(random)" >grafana_admin_password
chmod 0644 ./*
echo "wrote new secrets in $(pwd)"
