#!/usr/bin/env bash
# The integrity tier (tests/tests/integrity.rs): racing writers in two databases,
# then amcheck over every index and leaf, test_decoding and pgoutput against the
# tables, a streaming standby against the primary; and crash rounds (SIGKILL of
# the postmaster with every process of the server, or of one backend, during bulk
# batches and band creation). It kills its server, so it has one of its own, with
# a standby, started here on throwaway clusters.
# Usage: scripts/integrity.sh [SECONDS] [ROUNDS]: how long the writers race (30)
# and how many crash rounds run (3, one of each kind). scripts/test.sh runs the
# defaults, scripts/stress.sh longer ones.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
seconds=${1:-30}
rounds=${2:-3}

port=$(free_port)
# wal_keep_size: the crash rounds write about a million rows each and restart
# the primary, whose checkpoint after recovery removed WAL the standby had not
# received yet (it then waited for a segment gone for good and the test saw a
# standby that never caught up); kept WAL lets it catch up after every crash.
cluster_start integrity "$port" "wal_level = logical" "max_replication_slots = 10" \
    "max_worker_processes = 32" "max_locks_per_transaction = 256" "wal_keep_size = '4GB'"
port_sb=$(free_port)
trap 'cluster_stop integrity_standby; cluster_stop integrity' EXIT
cluster_start_standby integrity_standby "$port" "$port_sb"
export ENVELOPES_TEST_INTEGRITY_PG="host=127.0.0.1 port=$port user=postgres"
export ENVELOPES_TEST_INTEGRITY_STANDBY="host=127.0.0.1 port=$port_sb user=postgres"
export ENVELOPES_TEST_INTEGRITY_DATA="$ENVELOPES_TMP/integrity/data"
export ENVELOPES_TEST_INTEGRITY_LOG="$ENVELOPES_TMP/integrity/server.log"
export ENVELOPES_TEST_INTEGRITY_PG_CTL="$PG_BIN/pg_ctl"
# TestDb's helpers drop their databases through ENVELOPES_TEST_PG's server.
export ENVELOPES_TEST_PG="$ENVELOPES_TEST_INTEGRITY_PG"
ENVELOPES_INTEGRITY_SECONDS=$seconds ENVELOPES_INTEGRITY_ROUNDS=$rounds \
    cargo test -p pg_envelopes_tests --test integrity -- --ignored --test-threads=1 --nocapture
log "integrity tier passed ($seconds s of racing writers, $rounds crash rounds)"
