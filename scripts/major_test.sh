#!/usr/bin/env bash
# The extension on one newer Postgres major, built for it from the same source:
#   scripts/major_test.sh 17|18
# (18 is the build with assertions on, see scripts/postgres_build.sh). Runs, as
# scripts/test.sh does on 15: the in-backend tests (cargo pgrx test pgNN), the
# pg_regress golden files and isolation specs, and the client integration tests
# (tests/: the direct write path, the feed, concurrency, crashes of backends,
# restores into a fresh server, a standby, a server without worker slots, a
# small lock table) against throwaway clusters of that major. The router's
# tests need PL/Proxy, which is packaged for Debian's 15 only: they run on 15.
set -euo pipefail
cd "$(dirname "$0")/.."
export ENVELOPES_PG_MAJOR=${1:?usage: major_test.sh 17|18}
case "$ENVELOPES_PG_MAJOR" in 17|18) ;; *) echo "major_test.sh: 17 or 18" >&2; exit 64 ;; esac
export ENVELOPES_TMP=${ENVELOPES_TMP:-/var/tmp/pg_envelopes}/pg$ENVELOPES_PG_MAJOR
# The major named above decides the installation, not one a caller exported
# (scripts/test.sh exports PG_BIN for its 15 tiers).
unset PG_BIN PG_CONFIG PGXS_TEST
source scripts/lib.sh
[ -x "$PG_CONFIG" ] || { log "$PG_CONFIG is missing: scripts/setup.sh builds it"; exit 1; }
M=$ENVELOPES_PG_MAJOR
install -d -o postgres -g postgres "$ENVELOPES_TMP" "$ENVELOPES_TMP/pgrx"

log "cargo pgrx test pg$M ($("$PG_CONFIG" --version), configured $("$PG_CONFIG" --configure | grep -o -- '--enable-cassert' || echo 'without assertions'))"
cargo pgrx test "pg$M" --runas postgres --pgdata "$ENVELOPES_TMP/pgrx"

install_extension debug

log "pg_regress and isolation specs on $M"
scripts/run_pg_test.sh

log "integration tests on $M"
trap stop_integration_clusters EXIT
start_integration_clusters
# Every test binary but the router's (PL/Proxy) and pg_upgrade's (scripts/test.sh
# runs it once, across majors).
tests=()
for f in tests/tests/*.rs; do
    t=$(basename "$f" .rs)
    case "$t" in router|pg_upgrade) continue ;; esac
    tests+=(--test "$t")
done
cargo test -p pg_envelopes_tests "${tests[@]}" -- --test-threads=4

# The library built for 15 (installed by scripts/test.sh before this) is refused
# by this major: Postgres names the library, and the reason (a symbol 15 has and
# this major does not, or the magic block's version mismatch).
other=/usr/lib/postgresql/15/lib/pg_envelopes.so
if [ -f "$other" ]; then
    port=${ENVELOPES_TEST_PG##*port=}; port=${port%% *}
    out=$(cluster_psql itest "$port" postgres -c "LOAD '$other'" 2>&1 || true)
    if ! grep -q "could not load library \"$other\"\|incompatible library \"$other\"" <<<"$out"; then
        log "loading the library built for 15 into $M was not refused as expected: $out"
        exit 1
    fi
    log "the library built for 15 is refused by $M: $out"
fi
log "Postgres $M: all passed"
