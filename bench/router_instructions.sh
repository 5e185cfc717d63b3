#!/usr/bin/env bash
# The shard's instructions per call, straight from a client vs through
# pg_envelopes_router (PL/Proxy), counted by valgrind (callgrind): what a shard
# spends on a routed call, free of the timing noise of two shared cores (where
# the proxy, the shard and the client take turns on the same CPUs).
#
# usage: bench/router_instructions.sh [OUT.tsv]
#
# The shard server runs under callgrind, which writes one count per process at
# its exit; the backend that served a client's connection (straight, or the
# proxy's connection for that client) is the largest new count. Each variant runs
# N1 and N2 calls on a connection of its own; (count(N2) - count(N1)) / (N2 - N1)
# is what one more call costs, connection start-up cancelled out. Clients:
#   binary  bridge/examples/bulk_load (tokio-postgres: prepared, every value a
#           binary bind parameter, as gateways written with tokio-postgres or
#           pgx send them), single rows and 100-row batches (of one
#           originator, and spread over 4 originators of the shard: mixed)
#   text    pgbench -M prepared with the topic and envelope as text bind
#           parameters (psql-like clients), single rows
#   select1 `SELECT 1` unprepared (how PL/Proxy sends every call) vs prepared:
#           the protocol's own floor for parsing and planning a statement
# Keys are fresh for every run (sequence ids from the clock), so every call takes
# the insert path of new rows. Expects both extensions installed (bench/run.sh
# installs the release build first).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

out=${1:-bench/out/router_instructions.tsv}
mkdir -p "$(dirname "$out")"
: >"$out"
BULK=${BULK:-target/release/examples/bulk_load}
[ -x "$BULK" ] || cargo build --quiet --release -p envelopes-bridge --example bulk_load

shard=rishard proxy=riproxy
counts="$ENVELOPES_TMP/$shard/counts"
sport=$(free_port)
pport=$(free_port)
cleanup() {
    pkill -f "callgrind.*$ENVELOPES_TMP/$shard/data" 2>/dev/null || true
    for _ in $(seq 50); do pgrep -f "callgrind.*$ENVELOPES_TMP/$shard/data" >/dev/null || break; sleep 0.2; done
    cluster_stop "$proxy"
    rm -rf "${ENVELOPES_TMP:?}/$shard" "${ENVELOPES_TMP:?}/$proxy"
}
trap cleanup EXIT

cluster_start "$shard" "$sport" "synchronous_commit = off" "autovacuum = off" "shared_buffers = 256MB"
cluster_psql "$shard" "$sport" postgres -q -c "CREATE DATABASE envelopes"
cluster_psql "$shard" "$sport" envelopes -q -c "CREATE EXTENSION pg_envelopes" \
    -c "SELECT envelopes.ensure_gateway_parts(n, 1, 10000000000000000) FROM generate_series(1, 4) n" >/dev/null
cluster_stop "$shard"
install -d -o postgres -g postgres "$counts"
# The whole server under callgrind: backends are forked, so each gets a count.
as_postgres valgrind --tool=callgrind --callgrind-out-file="$counts/cg.%p" \
    "$PG_BIN/postgres" -D "$ENVELOPES_TMP/$shard/data" >"$ENVELOPES_TMP/$shard/valgrind.log" 2>&1 &
for _ in $(seq 300); do "$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$sport" && break; sleep 0.2; done
cluster_start "$proxy" "$pport" "synchronous_commit = off"
cluster_psql "$proxy" "$pport" postgres -q -c "CREATE DATABASE envelopes"
cluster_psql "$proxy" "$pport" envelopes -q -c "SET client_min_messages = warning" \
    -c "CREATE EXTENSION pg_envelopes_router CASCADE" \
    -c "SELECT count(*) FROM envelopes_router.set_shards(ARRAY['host=127.0.0.1 port=$sport dbname=envelopes'])" >/dev/null

TOPIC='\x0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef'
ENVELOPE="\\x$(printf 'a5%.0s' $(seq 272))"
scripts="$ENVELOPES_TMP/$shard/scripts"
install -d "$scripts"
printf '\\set seq :seq + 1\nSELECT envelopes.insert_gateway_envelope(1, :seq, :topic, :envelope);\n' >"$scripts/text.sql"
printf 'SELECT 1;\n' >"$scripts/select1.sql"

# served_count CMD...: runs the client command, then prints the count of the
# shard backend that served it (the largest count written since).
served_count() {
    local before best=0 t f
    before=$(ls "$counts" | sort)
    "$@" >/dev/null
    for _ in $(seq 100); do
        [ -n "$(comm -13 <(echo "$before") <(ls "$counts" | sort))" ] && break
        sleep 0.2
    done
    sleep 2
    for f in $(comm -13 <(echo "$before") <(ls "$counts" | sort)); do
        t=$(awk '/^(summary|totals):/ { print $2; exit }' "$counts/$f")
        [ -n "$t" ] && [ "$t" -gt "$best" ] && best=$t
    done
    echo "$best"
}

fresh_seq() { echo $(( $(date +%s%N) / 1000 )); }

# client KIND PORT CALLS: one connection making CALLS calls.
client() {
    local kind=$1 port=$2 calls=$3
    case $kind in
    single_binary|batch_binary|mixed_binary)
        local mode=single rows=1 spread=1
        [ "$kind" = batch_binary ] && mode=extension rows=100
        [ "$kind" = mixed_binary ] && mode=extension rows=100 spread=4
        ENVELOPES_LOAD_NODES=1 ENVELOPES_LOAD_FIRST_SEQ=$(fresh_seq) ENVELOPES_LOAD_CALLS=$calls \
            ENVELOPES_LOAD_SPREAD=$spread \
            "$BULK" "host=127.0.0.1 port=$port user=postgres dbname=envelopes" "$mode" 1 3600 "$rows" ;;
    single_text)
        "$PG_BIN/pgbench" -n -M prepared -h 127.0.0.1 -p "$port" -U postgres -c 1 -t "$calls" \
            -D seq="$(fresh_seq)" -D topic="$TOPIC" -D envelope="$ENVELOPE" -f "$scripts/text.sql" envelopes ;;
    select1_unprepared|select1_prepared)
        local mode=prepared
        [ "$kind" = select1_unprepared ] && mode=extended
        "$PG_BIN/pgbench" -n -M "$mode" -h 127.0.0.1 -p "$port" -U postgres -c 1 -t "$calls" \
            -f "$scripts/select1.sql" envelopes ;;
    esac
}

# measure KIND WHERE N1 N2: instructions per call, recorded as KIND_WHERE.
measure() {
    local kind=$1 where=$2 n1=$3 n2=$4 port=$sport i1 i2 per_call
    [ "$where" = routed ] && port=$pport
    i1=$(served_count client "$kind" "$port" "$n1")
    i2=$(served_count client "$kind" "$port" "$n2")
    per_call=$(( (i2 - i1) / (n2 - n1) ))
    printf '%s\t%s\n' "${kind}_$where" "$per_call" >>"$out"
    log "shard instructions per call, $kind $where: $per_call"
}

for where in direct routed; do
    measure single_binary "$where" 200 1200
    measure single_text "$where" 200 1200
    measure batch_binary "$where" 20 120
    measure mixed_binary "$where" 20 120
done
measure select1_unprepared direct 200 1200
measure select1_prepared direct 200 1200
