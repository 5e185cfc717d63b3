#!/usr/bin/env bash
# bench/failover.sh [RUNS] [SECONDS]: what --forward-after standby-flush costs,
# and how long a failover interrupts forwarding, on this machine (loopback).
#
# 1. Commit -> consumer latency at 1,000 single-row commits a second (pgbench
#    -R 1000, 4 clients), a primary with a synchronous standby
#    (synchronous_standby_names = '*', synchronous_commit = on), the bridge
#    forwarding to NATS JetStream (a fresh stream per run on ENVELOPES_BENCH_NATS,
#    default the local server) with --forward-after commit and standby-flush,
#    interleaved, RUNS runs (3) of SECONDS seconds (20) each; read by
#    bridge/examples/latency_probe.rs with the NATS client (p50, p99, max).
# 2. Failover time, RUNS times: a fresh primary and synchronous standby, a
#    bridge (JSONL sink) connected by a multi-host URL, a row forwarded; then
#    kill -9 of every process of the primary, pg_ctl promote of the standby, and
#    a writer inserting one row every 20 ms through the multi-host URL: the time
#    from the kill to the first row committed on the new primary appearing in the
#    sink.
#
# Results go to bench/out/failover.tsv and are printed; bench/RESULTS.md has the
# last figures. Servers run under ENVELOPES_TMP on free ports, as `postgres`,
# and are removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
RUNS=${1:-3}
SECONDS_PER_RUN=${2:-20}
NATS_URL=${ENVELOPES_BENCH_NATS:-nats://127.0.0.1:4222}
OUT=bench/out
mkdir -p "$OUT"
RESULTS=$OUT/failover.tsv
: >"$RESULTS"
TARGET=${CARGO_TARGET_DIR:-target}

# ENVELOPES_BENCH_INSTALLED=1: use the extension already installed in PG_BIN's tree.
[ "${ENVELOPES_BENCH_INSTALLED:-0}" = 1 ] || install_extension release
cargo build --quiet --release -p envelopes-bridge --bin envelopes-bridge --example latency_probe
BRIDGE=$TARGET/release/envelopes-bridge
PROBE=$TARGET/release/examples/latency_probe

tag=fo$$
primary=${tag}p standby=${tag}s
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for n in "$primary" "$standby"; do
        cluster_stop "$n"
        rm -rf "${ENVELOPES_TMP:?}/$n"
    done
}
trap cleanup EXIT

# pair: a primary and a synchronous standby of it, on fresh ports.
pair() {
    cleanup
    mapfile -t ports < <(pick_ports 2 20000-32000)
    PPORT=${ports[0]} SPORT=${ports[1]}
    cluster_start "$primary" "$PPORT" "wal_level = replica" "max_wal_senders = 5" "fsync = off"
    psqlp "$PPORT" postgres -q -c "CREATE DATABASE bench"
    psqlp "$PPORT" bench -q -c "CREATE EXTENSION pg_envelopes" -c "CREATE SEQUENCE bench_seq"
    local dir=$ENVELOPES_TMP/$standby
    install -d -o postgres -g postgres "$dir"
    as_postgres "$PG_BIN/pg_basebackup" -h 127.0.0.1 -p "$PPORT" -U postgres -D "$dir/data" \
        -R -X stream -c fast >/dev/null 2>&1
    printf "port = %s\nunix_socket_directories = '%s'\nhot_standby = on\n" "$SPORT" "$dir" \
        >>"$dir/data/postgresql.conf"
    as_postgres "$PG_BIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start >/dev/null
    psqlp "$PPORT" postgres -q -c "ALTER SYSTEM SET synchronous_standby_names = '*'" \
        -c "SELECT pg_reload_conf()" >/dev/null
    until [ "$(psqlp "$PPORT" postgres -At -c "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'")" = 1 ]; do
        sleep 0.1
    done
}

psqlp() { "$PG_BIN/psql" -X -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$1" -U postgres -d "$2" "${@:3}"; }
record() { printf '%s\t%s\t%s\t%s\n' "$@" >>"$RESULTS"; }

# 1. Latency, the two modes interleaved on one pair.
pair
for run in $(seq "$RUNS"); do
    for mode in commit standby-flush; do
        [ $((run % 2)) = 0 ] && mode=$([ "$mode" = commit ] && echo standby-flush || echo commit)
        name="${tag}r${run}${mode//-/}"
        psqlp "$PPORT" bench -q -c "SELECT envelopes.consumer_register('$name', false)" >/dev/null
        n=$((SECONDS_PER_RUN * 1000))
        "$PROBE" "$NATS_URL" "$name" "$n" >"$OUT/probe.out" &
        probe=$!
        until grep -q ready "$OUT/probe.out" 2>/dev/null; do sleep 0.1; done
        "$BRIDGE" egress --database-url "postgres://postgres@127.0.0.1:$PPORT/bench" --name "$name" \
            --sink "$NATS_URL" --nats-stream "${name^^}" --subject-prefix "$name" \
            --forward-after "$mode" 2>"$OUT/bridge-$mode.log" &
        bridge=$!
        pids=("$bridge")
        "$PG_BIN/pgbench" -n -M prepared -h 127.0.0.1 -p "$PPORT" -U postgres -c 4 -j 2 -R 1000 \
            -t $((n / 4)) -f bench/sql/insert_rate.sql bench >/dev/null 2>"$OUT/pgbench.err"
        wait "$probe"
        read -r p50 p99 max count < <(tail -n 1 "$OUT/probe.out")
        record "$mode" "$run" p50_ms "$p50"
        record "$mode" "$run" p99_ms "$p99"
        log "latency $mode run $run: commit->consumer p50 ${p50}ms p99 ${p99}ms max ${max}ms ($count messages)"
        kill -TERM "$bridge"; wait "$bridge" || true
        "$PROBE" "$NATS_URL" --delete "${name^^}"
    done
done

# 2. Failover time.
for run in $(seq "$RUNS"); do
    pair
    url="postgres://postgres@127.0.0.1:$PPORT,127.0.0.1:$SPORT/bench?target_session_attrs=read-write"
    conn="host=127.0.0.1,127.0.0.1 port=$PPORT,$SPORT user=postgres dbname=bench target_session_attrs=read-write connect_timeout=1"
    sink=$OUT/$tag.jsonl
    rm -f "$sink"
    "$BRIDGE" egress --database-url "$url" --name fo --register --sink "jsonl:$sink" \
        --poll-interval-ms 200 2>"$OUT/bridge.log" &
    bridge=$!
    pids=("$bridge")
    "$PG_BIN/psql" "$conn" -qAt -c "SELECT envelopes.insert_gateway_envelope(9, 1, '\\x01', '\\x01')" >/dev/null
    until grep -q '"9:1"' "$sink" 2>/dev/null; do sleep 0.05; done
    killed=$(date +%s.%N)
    mapfile -t procs < <(echo "$(head -n 1 "$ENVELOPES_TMP/$primary/data/postmaster.pid")"; \
        ps --ppid "$(head -n 1 "$ENVELOPES_TMP/$primary/data/postmaster.pid")" -o pid=)
    kill -KILL "${procs[@]}" 2>/dev/null || true
    rm -f "$ENVELOPES_TMP/$primary/data/postmaster.pid"
    as_postgres "$PG_BIN/pg_ctl" -D "$ENVELOPES_TMP/$standby/data" -w -t 60 promote >/dev/null
    seq=2
    until grep -q "\"9:[0-9]*\".*" <(grep -v '"9:1"' "$sink" 2>/dev/null); do
        "$PG_BIN/psql" "$conn" -qAt -c "SELECT envelopes.insert_gateway_envelope(9, $seq, '\\x01', '\\x01')" \
            >/dev/null 2>&1 && seq=$((seq + 1))
        sleep 0.02
    done
    took=$(python3 -c "print(f'{$(date +%s.%N) - $killed:.2f}')")
    record failover "$run" seconds "$took"
    log "failover run $run: primary killed -> first row from the new primary on the sink: ${took}s"
    kill -TERM "$bridge"; wait "$bridge" || true
done

python3 - "$RESULTS" <<'PY'
import sys, statistics
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
def values(mode, metric):
    return [float(r[3]) for r in rows if r[0] == mode and r[2] == metric]
for mode in ("commit", "standby-flush"):
    p50, p99 = values(mode, "p50_ms"), values(mode, "p99_ms")
    print(f"{mode:14} p50 median {statistics.median(p50):.2f} ms, p99 median {statistics.median(p99):.2f} ms  (runs: p99 {p99})")
f = values("failover", "seconds")
print(f"failover: median {statistics.median(f):.2f} s, max {max(f):.2f} s  (runs {f})")
PY
