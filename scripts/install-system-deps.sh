#!/usr/bin/env bash
# Installs what the embedded cluster needs from Debian's packages, only when it is missing:
# ZooKeeper (jars under /usr/share/java, run with the system Java), the PostgreSQL 15 server
# binaries (initdb, pg_ctl, postgres, pgbench) and psql, python3-venv, and faketime (libfaketime
# skews one node's clock in the chaos tests).
# Needs root (or sudo) only when something is missing; prints what to install otherwise.
set -euo pipefail

missing=()
[ -f /usr/share/java/zookeeper.jar ] || missing+=(zookeeper)
command -v java >/dev/null 2>&1 || missing+=(default-jre-headless)
[ -x /usr/lib/postgresql/15/bin/postgres ] || missing+=(postgresql-15)
command -v psql >/dev/null 2>&1 || missing+=(postgresql-client-15)
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || missing+=(python3-venv)
command -v faketime >/dev/null 2>&1 || missing+=(faketime)  # one node's clock, chaos tests

if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi

echo "installing Debian packages: ${missing[*]}" >&2
if [ "$(id -u)" -eq 0 ]; then
    as_root=()
elif command -v sudo >/dev/null 2>&1; then
    as_root=(sudo)
else
    echo "error: missing packages (${missing[*]}); run as root: apt-get install ${missing[*]}" >&2
    exit 69
fi
export DEBIAN_FRONTEND=noninteractive
"${as_root[@]}" apt-get update -qq
"${as_root[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
