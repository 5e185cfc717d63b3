#!/usr/bin/env bash
# The documentation test: every ```sql block of README.md and of the book
# (docs/, in docs/SUMMARY.md order) runs against a throwaway cluster with the
# extension installed, shown output compared; every envelopes-bridge command
# line and ```toml block is parsed by the bridge (--check-config); the
# README's tour runs as written, the bridge to a private nats-server; README.md
# stays under 15 KB and every relative link resolves. The rules are in
# docs/contributing/testing.md ("The documentation test"); the work is done by
# scripts/docs_test.py.
#
#   scripts/docs_test.sh            everything (the extension must be installed:
#                                   scripts/test.sh runs this after install_extension)
#   scripts/docs_test.sh --accept   the same, rewriting ```output blocks with what
#                                   the server printed (read the diff)
#   scripts/docs_test.sh --links    only the checks that need no server or build
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

mode=${1:-}
case "$mode" in
    ""|--accept|--links) ;;
    *) echo "usage: $0 [--accept|--links]" >&2; exit 2 ;;
esac

log "README size and links"
python3 scripts/docs_test.py links
[ "$mode" = --links ] && exit 0

log "bridge command lines and configuration files (--check-config)"
cargo build -q -p envelopes-bridge
python3 scripts/docs_test.py bridge "${CARGO_TARGET_DIR:-$PWD/target}/debug/envelopes-bridge"

log "sql blocks against a throwaway cluster"
port=$(free_port)
trap 'cluster_stop docs' EXIT
cluster_start docs "$port"
python3 scripts/docs_test.py sql "$port" ${mode:+"$mode"}

log "the README's tour, bridge to a private nats-server included"
python3 scripts/docs_test.py tour "$port" "${CARGO_TARGET_DIR:-$PWD/target}/debug/envelopes-bridge" \
    "$ENVELOPES_TMP/docs/tour"
