#!/usr/bin/env bash
# Stress targets (not run by CI), on throwaway clusters:
#   - the eight-writer band-crossing test repeated ROUNDS times in both creation
#     modes (100 by default);
#   - the change feed's randomized test for SECONDS (600 by default): writers on
#     shared originators with ids up and down, rollbacks, outbox rows, and the
#     bridge killed with SIGKILL at random moments; every committed row must reach
#     JetStream once (CI runs the same test for about a minute);
#   - the integrity tier (scripts/integrity.sh) with its writers racing for
#     SECONDS and 9 crash rounds (CI: 30 s and 3).
# Usage: scripts/stress.sh [ROUNDS] [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
source scripts/lib.sh
rounds=${1:-100}
seconds=${2:-600}
install_extension debug
port=$(free_port)
cluster_start stress "$port" "max_worker_processes = 16"
trap 'cluster_stop stress' EXIT
export ENVELOPES_TEST_PG="host=127.0.0.1 port=$port user=postgres"
ENVELOPES_STRESS_ROUNDS=$rounds cargo test -p pg_envelopes_tests --test concurrency -- --test-threads=1
log "$rounds rounds in each mode passed"
ENVELOPES_STRESS_SECS=$seconds cargo test -p envelopes-bridge --test delivery randomized -- --test-threads=1
log "$seconds s of randomized writers and bridge kills lost nothing"
scripts/integrity.sh "$seconds" 9
