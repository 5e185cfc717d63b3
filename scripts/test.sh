#!/usr/bin/env bash
# Runs every test of pg_envelopes, from a fresh machine or a warm one:
#   1. machine setup (scripts/setup.sh), and servers left by killed runs stopped
#   2. cargo fmt --check and cargo clippy -D warnings
#   3. cargo pgrx test: plain #[test]s and in-backend #[pg_test]s
#   4. pg_regress golden files and isolation specs (pg_test/), then the
#      documentation test (scripts/docs_test.sh: README.md's and docs/'s
#      examples run, bridge command lines parsed, links)
#   5. client integration tests (tests/) and the bridge's end-to-end tests
#      (bridge/tests/) against a throwaway cluster and the local message buses,
#      and the router's against four throwaway shards (scripts/shards.sh)
#   6. scripts beside the code: two scripts/shards.sh side by side
#      (scripts/shards_test.sh), prune_expired on a pg_cron schedule
#      (scripts/cron_test.sh), the extension's own maintenance worker
#      (scripts/maintenance_test.sh); beside the pg_cron test, which mostly
#      sleeps, the Promela models of the no-loss contracts (model/, spin) are
#      checked and step 8's Postgres 15.18 is built
#   7. the integrity tier (scripts/integrity.sh: racing writers, amcheck,
#      decoding, a standby, crash rounds) against a server of its own
#   8. Postgres 17 and 18 (the 18 with assertions on): the same tiers 3 to 5
#      for each (scripts/major_test.sh), then pg_upgrade from 15 to each, --copy
#      and --link, with the extension in use (tests/tests/pg_upgrade.rs)
#   9. the Debian packages, for 15 installed, used and removed, for 17 and 18
#      their files used in those servers (scripts/package_test.sh)
#
# ENVELOPES_PG_MAJORS="15" (default "15 17 18") leaves out step 8 for a quick
# local run; .ci/run runs everything.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
source scripts/lib.sh
cleanup_leftover_clusters
started=$(date +%s)
step() { log "== $* ($(( $(date +%s) - started ))s)"; }

step "released SQL scripts are unchanged"
# An install or upgrade script, once released, is never edited: users' databases
# were built with it. New releases append their scripts' checksums.
sha256sum --quiet -c sql/releases/SHA256SUMS

step "format and lints"
cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings

step "cargo pgrx test (unit and in-backend tests)"
install -d -o postgres -g postgres "$ENVELOPES_TMP" "$ENVELOPES_TMP/pgrx"
cargo pgrx test pg15 --runas postgres --pgdata "$ENVELOPES_TMP/pgrx"

step "install the extension"
install_extension debug

step "pg_regress and isolation specs"
scripts/run_pg_test.sh

step "documentation: every sql example of README.md and docs/ run, bridge command lines and TOML parsed, links"
scripts/docs_test.sh

step "integration tests"
shards_dir=""
old_build=""
model_check=""
trap 'stop_integration_clusters; [ -z "$shards_dir" ] || scripts/shards.sh down "$shards_dir" 2>/dev/null
      for job in $old_build $model_check; do kill -- "-$job" 2>/dev/null || true; done' EXIT
start_integration_clusters
# Four shard servers, a proxy with pg_envelopes_router, and one spare shard for
# the partition move (tests/tests/router.rs, bridge/tests/shards.rs).
shards_dir=$(ENVELOPES_SHARDS_OWNER=$$ scripts/shards.sh up 4)
scripts/shards.sh add "$shards_dir" >/dev/null
export ENVELOPES_TEST_SHARDS="$shards_dir/env"
cargo test -p pg_envelopes_tests -- --test-threads=4

step "bridge tests (real NATS JetStream, Redis, Mosquitto, RabbitMQ, a webhook receiver, bridges per shard)"
cargo test -p envelopes-bridge -- --test-threads=2

step "shards.sh side by side; prune_expired on a pg_cron schedule (about 3 minutes: pg_cron 1.4 runs once a minute); the maintenance worker"
scripts/shards_test.sh
# Beside the pg_cron test, which mostly sleeps until its schedule's next
# minute, two jobs that only need CPU run at the lowest CPU and I/O priority,
# each in a process group of its own (stopped with the run): the model checks
# (waited for right after it) and the old side of step 8's pg_upgrade test (a
# 15.18, see scripts/postgres_build.sh; waited for at step 8).
setsid nice -n 19 ionice -c 3 model/check.sh >"$ENVELOPES_TMP/model-check.log" 2>&1 &
model_check=$!
newer=()
for major in ${ENVELOPES_PG_MAJORS:-15 17 18}; do
    [ "$major" = 15 ] || newer+=("$major")
done
if [ "${#newer[@]}" -gt 0 ]; then
    setsid nice -n 19 ionice -c 3 scripts/postgres_build.sh 15 \
        >"$ENVELOPES_TMP/pg15-build.out" 2>"$ENVELOPES_TMP/pg15-build.log" &
    old_build=$!
fi
scripts/cron_test.sh
step "model checks (spin), run beside the pg_cron test"
wait "$model_check" || { cat "$ENVELOPES_TMP/model-check.log"; log "model checks failed"; exit 1; }
model_check=""
cat "$ENVELOPES_TMP/model-check.log"
scripts/maintenance_test.sh

step "integrity tier (races, amcheck, decoding, standby, crashes)"
scripts/integrity.sh

for major in "${newer[@]}"; do
    step "Postgres $major: in-backend tests, pg_regress and isolation, integration tests"
    scripts/major_test.sh "$major"
done
if [ "${#newer[@]}" -gt 0 ]; then
    step "pg_upgrade from 15 to ${newer[*]} (--copy and --link) with the extension in use"
    # The old side is a 15.18 built from bookworm's source package (see
    # scripts/postgres_build.sh for why not Debian's 15.20), with this build of
    # the extension installed; the new sides got theirs from major_test.sh.
    wait "$old_build" || { log "building Postgres 15.18 failed:"; cat "$ENVELOPES_TMP/pg15-build.log" >&2; exit 1; }
    old_build=""
    old_config=$(cat "$ENVELOPES_TMP/pg15-build.out")
    cat "$ENVELOPES_TMP/pg15-build.log" >&2
    PG_CONFIG=$old_config install_extension debug
    upgrade_to=()
    for major in "${newer[@]}"; do upgrade_to+=("$(dirname "$(pg_config_of "$major")")"); done
    install -d -o postgres -g postgres "$ENVELOPES_TMP/upgrade"
    ENVELOPES_TEST_UPGRADE_FROM=$(dirname "$old_config") ENVELOPES_TEST_UPGRADE_TO="${upgrade_to[*]}" \
        ENVELOPES_TEST_UPGRADE_DIR="$ENVELOPES_TMP/upgrade" \
        cargo test -p pg_envelopes_tests --test pg_upgrade -- --test-threads=1
fi

step "Debian packages for 15, 17 and 18: build, install, create and upgrade, router, bridge, remove"
# From the debug builds the steps above made: the packaging is what is tested,
# and release builds from cold would add a quarter of an hour
# (scripts/package_test.sh without --debug tests the release packages).
scripts/package_test.sh --debug

step "all tests passed"
