#!/bin/bash
# Interleaved pgbench A/B of one claim: migration 0010's claim_blocks (A, installed beside
# as claim_blocks_0010) against 0011's without a bound in force (B: no leader heartbeat, as
# with an older leader) and with one (C). Prints tps and mean latency per round, variant
# and client count. Throwaway PostgreSQL 15 on 127.0.0.1:$PORT under $W, stopped on exit.
# Run as root from the checkout (make venv first): ROUNDS="1 2 3" bash scripts/claim-ab-0011.sh
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
W=${W:-$(mktemp -d /tmp/claim-ab.XXXXXX)}; D=$W/data; PORT=${PORT:-55433}
rm -rf $D; mkdir -p $D; chown postgres $D $W
su postgres -c "/usr/lib/postgresql/15/bin/initdb -D $D -A trust -U postgres >/dev/null"
su postgres -c "/usr/lib/postgresql/15/bin/pg_ctl -D $D -l $W/pg.log -o '-p $PORT -k $W -c listen_addresses=127.0.0.1 -c max_connections=100' -w start >/dev/null"
trap 'su postgres -c "/usr/lib/postgresql/15/bin/pg_ctl -D $D -m fast -w stop" >/dev/null' EXIT
URL="postgresql://postgres@127.0.0.1:$PORT/postgres"
cd $REPO
.venv/bin/allocator migrate --database-url "$URL" >/dev/null
.venv/bin/python - "$URL" <<'PY'
import sys
import psycopg
from allocator.bench.stock import TAKE_FENCE, CUT_BLOCKS, LAYOUT_JSON, BENCH_LAYOUT, EPOCH
url = sys.argv[1]
down = open("migrations/sql/0011/downgrade.sql").read()
start = down.index("CREATE OR REPLACE FUNCTION allocator.claim_blocks(")
end = down.index("$fn$;", start) + 5
old = down[start:end].replace("allocator.claim_blocks(", "allocator.claim_blocks_0010(", 1)
with psycopg.connect(url, autocommit=True) as c:
    c.execute(old)
    c.execute(TAKE_FENCE, (EPOCH, 1, LAYOUT_JSON))
    now = int(c.execute("SELECT allocator.db_now_ms()").fetchone()[0])
    base = now - 60_000
    total = 1_200_000
    for chunk in range(0, total, 100_000):
        firsts = []; lasts = []
        for i in range(chunk, chunk + 100_000):
            f = BENCH_LAYOUT.encode(base + i // 32, 0, i % 32, 0)
            firsts.append(f); lasts.append(f + 4095)
        # one cut_blocks call per 1000 blocks
        for j in range(0, len(firsts), 1000):
            c.execute(CUT_BLOCKS, (EPOCH, firsts[j:j+1000], lasts[j:j+1000], LAYOUT_JSON))
    c.execute("VACUUM ANALYZE allocator.blocks")
    print("stocked", c.execute("SELECT count(*) FROM allocator.blocks").fetchone()[0])
PY
echo "SELECT * FROM allocator.claim_blocks_0010('bench', 1);" > $W/a.pgb
echo "SELECT * FROM allocator.claim_blocks('bench', 1);" > $W/b.pgb
HB="SELECT allocator.leader_heartbeat(0, 1, 3600000, true, 3600000)"
for round in ${ROUNDS:-1 2 3}; do
  for v in A B C; do
    case $v in
      A) psql -q "$URL" -c "DELETE FROM allocator.block_age" ; S=$W/a.pgb;;
      B) psql -q "$URL" -c "DELETE FROM allocator.block_age" ; S=$W/b.pgb;;
      C) psql -q "$URL" -c "$HB" >/dev/null; S=$W/b.pgb;;
    esac
    for clients in 1 8; do
      out=$(pgbench -n -M prepared -c $clients -j $clients -T 8 -f $S "$URL" 2>&1)
      tps=$(echo "$out" | grep -oP 'tps = \K[0-9.]+' | head -1)
      lat=$(echo "$out" | grep -oP 'latency average = \K[0-9.]+')
      echo "round=$round variant=$v clients=$clients tps=$tps lat_ms=$lat"
    done
  done
done
psql -q "$URL" -At -c "SELECT count(*) FILTER (WHERE claimed_by='allocator:voided-aged'), count(*) FILTER (WHERE claimed_at IS NULL) FROM allocator.blocks"
