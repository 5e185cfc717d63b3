#!/usr/bin/env bash
# Stress target (not run by CI): the eight-writer band-crossing test repeated many
# times in both creation modes on a throwaway cluster. Usage: scripts/stress.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
rounds=${1:-100}
install_extension debug
port=$(free_port)
cluster_start stress "$port" "max_worker_processes = 16"
trap 'cluster_stop stress' EXIT
export ENVELOPES_TEST_PG="host=127.0.0.1 port=$port user=postgres"
ENVELOPES_STRESS_ROUNDS=$rounds cargo test -p pg_envelopes_tests --test concurrency -- --test-threads=1
log "$rounds rounds in each mode passed"
