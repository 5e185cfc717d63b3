#!/usr/bin/env bash
# Runs the pg_regress golden tests and the isolation specs in pg_test/ against a
# throwaway cluster with the installed extension. Usage: scripts/run_pg_test.sh
# [--accept] (--accept copies the results over the expected files; review the diff).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

accept=false
[ "${1:-}" = --accept ] && accept=true

out="$ENVELOPES_TMP/pg_test-out"
port=$(free_port)
cluster_start pg_test "$port"
trap 'cluster_stop pg_test' EXIT
rm -rf "$out"; install -d -o postgres -g postgres "$out" "$out/regress" "$out/isolation"

status=0
# pg_regress and isolationtester only talk to the server over libpq: run them as
# postgres so they can write their output directories.
as_postgres "$PGXS_TEST/regress/pg_regress" --bindir="$PG_BIN" --host=127.0.0.1 --port="$port" \
    --user=postgres --inputdir=pg_test --outputdir="$out/regress" \
    --schedule=pg_test/schedule --dbname=envelopes_regress --load-extension=pg_envelopes || status=1
as_postgres "$PGXS_TEST/isolation/pg_isolation_regress" --bindir="$PG_BIN" --host=127.0.0.1 --port="$port" \
    --user=postgres --inputdir=pg_test --outputdir="$out/isolation" \
    --schedule=pg_test/isolation_schedule --dbname=envelopes_isolation || status=1

if $accept; then
    cp "$out"/regress/results/*.out "$out"/isolation/results/*.out pg_test/expected/
    log "copied results into pg_test/expected/; review them with git diff"
elif [ "$status" != 0 ]; then
    cat "$out"/regress/regression.diffs "$out"/isolation/regression.diffs 2>/dev/null | head -200 >&2
fi
exit "$status"
