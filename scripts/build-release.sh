#!/usr/bin/env bash
# Builds an earlier release of the allocator, from its git revision, in a virtualenv of its own:
# .cache/releases/<REV>/ holds the sources (`git archive`) and .venv/ with them installed with
# the `node` extra (`allocator run`, `allocator migrate`). Kept across runs: a release whose
# `.built` marker is there is not built again. The rolling-upgrade test runs three nodes of one
# (tests/chaos/test_rolling_upgrade.py); `make test` builds it first, once.
# Usage: scripts/build-release.sh REV   (prints the release's folder)
set -euo pipefail

rev="${1:?usage: scripts/build-release.sh REV}"
root="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-python3}"
dir="$root/.cache/releases/$rev"

if [ -f "$dir/.built" ]; then
    echo "$dir"
    exit 0
fi
if ! git -C "$root" cat-file -e "$rev^{commit}" 2>/dev/null; then
    echo "error: revision $rev is not in this clone's history (a shallow clone? git fetch --unshallow)" >&2
    exit 69
fi
mkdir -p "$root/.cache/releases"
# One build at a time (two test workers, or make and a test): the second waits, then finds it built.
exec 9>"$root/.cache/releases/.lock"
flock 9
if [ ! -f "$dir/.built" ]; then
    echo "building release $rev in $dir (once; about a minute)" >&2
    rm -rf "$dir"
    mkdir -p "$dir"
    git -C "$root" archive "$rev" | tar -x -C "$dir"
    "$python" -m venv "$dir/.venv"
    "$dir/.venv/bin/pip" install -q "$dir[node]"
    touch "$dir/.built"
fi
echo "$dir"
