#!/usr/bin/env bash
# Every benchmark of pg_envelopes, side by side in one run: each comparison's
# variants run interleaved (A B C A B C ...), several times each, on the same
# throwaway cluster, first with synchronous_commit = off (CPU-bound) and then on
# (durable); the report compares medians. Results go to bench/out/results.tsv and
# are rendered into bench/RESULTS.md and bench/results.png by bench/report.py.
#
# Comparisons: insert (single-row: extension, plain INSERT into pre-created
# partitions with and without ON CONFLICT DO NOTHING, unpartitioned tables, xmtpd's
# SAVEPOINT pattern, pg_partman), batch (100 rows: the same variants but
# pg_partman), notify (doorbell on/off, 2 and 8 writers),
# crossing (p99 latency crossing bands, worker vs transaction vs existing bands),
# read (1,000-row cursor read at 50 vs 5,000 leaf partitions, selector vs a
# hand-written LATERAL query), bridge (backlog drain rate and commit -> JetStream
# latency).
#
# usage: bench/run.sh [--quick] [--only NAME[,NAME...]]
#   --quick   2 runs of 3 s per cell, durable variant only for insert and notify:
#             under 5 minutes, a smoke test of the numbers
#   --only    run only the named comparisons
set -euo pipefail
COMMAND="bench/run.sh $*"
cd "$(dirname "$0")/.."
source scripts/lib.sh

quick=false only=""
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) quick=true ;;
        --only) only=$2; shift ;;
        *) echo "usage: $0 [--quick] [--only NAME[,NAME...]]" >&2; exit 2 ;;
    esac
    shift
done
if $quick; then RUNS=2 SECONDS_PER_RUN=3; else RUNS=5 SECONDS_PER_RUN=15; fi

scripts/setup.sh
# The report plots with matplotlib: the first python3 on PATH if it has it, else
# Debian's python3 with python3-matplotlib (installed here when missing).
# (report.py itself needs only the standard library: without matplotlib it writes
# RESULTS.md and no plot.)
REPORT_PYTHON=python3
if ! python3 -c "import matplotlib" 2>/dev/null; then
    REPORT_PYTHON=/usr/bin/python3
    "$REPORT_PYTHON" -c "import matplotlib" 2>/dev/null \
        || apt-get install -y -qq --no-install-recommends python3-matplotlib >/dev/null \
        || log "matplotlib unavailable: no plot"
fi
install_extension release
cargo build --quiet --release -p envelopes-bridge --bin envelopes-bridge --example latency_probe
BRIDGE=target/release/envelopes-bridge
PROBE=target/release/examples/latency_probe
NATS_URL=${ENVELOPES_BENCH_NATS:-nats://127.0.0.1:4222}

OUT=bench/out
mkdir -p "$OUT"
RESULTS="$OUT/results.tsv"
: >"$RESULTS"
# Settings of the throwaway cluster, printed into the results.
TUNING=(
    "shared_buffers = 1GB"
    "max_wal_size = 8GB"
    "checkpoint_timeout = 30min"
    "wal_buffers = 64MB"
    "max_connections = 200"
    "max_locks_per_transaction = 512"   # a query over 5,000 partitions locks them all
    "autovacuum = off"   # no vacuum of the growing tables landing in one variant's run
)

selected() {
    { [ -z "$only" ] || [[ ",$only," == *",$1,"* ]]; } &&
        { [ -z "${only_here:-}" ] || [[ ",$only_here," == *",$1,"* ]]; }
}

# pgbench_tps DB CLIENTS SCRIPT: runs the script for SECONDS_PER_RUN and prints tps.
pgbench_tps() {
    local db=$1 clients=$2 script=$3
    "$PG_BIN/pgbench" -n -M prepared -h 127.0.0.1 -p "$PORT" -U postgres \
        -c "$clients" -j "$clients" -T "$SECONDS_PER_RUN" -f "$script" "$db" 2>"$OUT/pgbench.err" \
        | awk '/^tps = / { print $3; exit }'
}

# record COMPARISON VARIANT DURABILITY RUN VALUE UNIT
record() { printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >>"$RESULTS"; }

# interleave COMPARISON DURABILITY CLIENTS DB NAME=SCRIPT...: runs each variant
# RUNS times, alternating, and records tps.
interleave() {
    local comparison=$1 durability=$2 clients=$3 db=$4; shift 4
    local run pair name script tps
    for run in $(seq "$RUNS"); do
        for pair in "$@"; do
            name=${pair%%=*} script=${pair#*=}
            reset_tables "$db"
            tps=$(pgbench_tps "$db" "$clients" "$script")
            [ -n "$tps" ] || { cat "$OUT/pgbench.err" >&2; return 1; }
            record "$comparison" "$name" "$durability" "$run" "$tps" tps
            log "$comparison [$durability] $name run $run: $tps tps"
        done
    done
}

sql() { cluster_psql bench "$PORT" "$@"; }

# reset_tables DB: empty tables, sequence back to 1, checkpoint (bench/sql/reset.sql).
reset_tables() { sql "$1" -q -f bench/sql/reset.sql >/dev/null; }

# On any exit: stop what this script started in the background (listener, bridge,
# probe), remove the benchmark's JetStream stream, stop the cluster and delete its
# files (gigabytes after a full run).
stream=""
cleanup() {
    local pids
    pids=$(jobs -p)
    [ -z "$pids" ] || kill $pids 2>/dev/null || true
    if [ -n "$stream" ]; then "$PROBE" "$NATS_URL" --delete "$stream" >/dev/null 2>&1 || true; fi
    cluster_stop bench
    rm -rf "${ENVELOPES_TMP:?}/bench"
}

for durability in off on; do
    if $quick && [ "$durability" = on ]; then only_here=insert,notify; else only_here=""; fi
    PORT=$(free_port)
    cluster_start bench "$PORT" "${TUNING[@]}" "synchronous_commit = $durability"
    trap cleanup EXIT
    log "cluster on port $PORT, synchronous_commit = $durability; settings:"
    for t in "${TUNING[@]}"; do log "  $t"; done
    sql postgres -q -c "CREATE DATABASE bench"
    sql bench -q -f bench/sql/setup.sql >/dev/null

    if selected insert; then
        # Single-row inserts, 2 clients: the extension's function; a plain INSERT of
        # meta and blob into the same pre-created partitions, without and with
        # ON CONFLICT DO NOTHING; the same into unpartitioned tables; xmtpd's
        # SAVEPOINT pattern; pg_partman's premade partitions.
        interleave insert "$durability" 2 bench \
            extension=bench/sql/insert_extension.sql plain=bench/sql/insert_plain.sql \
            plain_idempotent=bench/sql/insert_plain_idempotent.sql \
            flat=bench/sql/insert_flat.sql savepoint=bench/sql/insert_savepoint.sql \
            partman=bench/sql/insert_partman.sql
    fi

    if selected batch; then
        # 100-row batches, 2 clients: the extension's batch function; a plain
        # INSERT ... SELECT into the pre-created partitions, without and with
        # ON CONFLICT DO NOTHING; the same inside xmtpd's savepoint; the same into
        # unpartitioned tables.
        interleave batch "$durability" 2 bench \
            extension=bench/sql/batch_extension.sql plain=bench/sql/batch_plain.sql \
            plain_idempotent=bench/sql/batch_plain_idempotent.sql \
            savepoint=bench/sql/batch_savepoint.sql flat=bench/sql/batch_flat.sql
    fi

    if selected notify; then
        # Single-row inserts with the NOTIFY doorbell on vs off, at 2 and 8 writers,
        # with a listener attached that drains notifications.
        "$PG_BIN/pgbench" -n -h 127.0.0.1 -p "$PORT" -U postgres -c 1 -T 100000 \
            -f bench/sql/listen.sql bench >/dev/null 2>&1 &
        listener=$!
        for run in $(seq "$RUNS"); do
            for writers in 2 8; do
                for mode in on off; do
                    reset_tables bench
                    tps=$(PGOPTIONS="-c envelopes.notify=$mode" pgbench_tps bench "$writers" bench/sql/insert_extension.sql)
                    [ -n "$tps" ] || { cat "$OUT/pgbench.err" >&2; exit 1; }
                    record notify "${mode}_${writers}" "$durability" "$run" "$tps" tps
                    log "notify [$durability] ${mode}_${writers} run $run: $tps tps"
                done
            done
        done
        kill "$listener" 2>/dev/null || true
    fi

    if selected crossing; then
        # 8 writers inserting into one originator, crossing a band every 10,000 rows,
        # with creation in a worker and in the writer's transaction; against the same
        # load into bands created beforehand. Each run uses a fresh originator.
        sql bench -q -c "CREATE SEQUENCE IF NOT EXISTS crossing_seq"
        node=100
        for run in $(seq "$RUNS"); do
            for variant in worker transaction steady; do
                node=$((node + 1))
                sql bench -q -c "ALTER SEQUENCE crossing_seq RESTART WITH 1"
                mode=$variant
                if [ "$variant" = steady ]; then
                    mode=worker
                    sql bench -q -c "SELECT envelopes.ensure_gateway_parts($node, b * 10000, 10000)
                                       FROM generate_series(0, 199) b" >/dev/null
                fi
                rm -f "$OUT"/lat.*
                PGOPTIONS="-c envelopes.band_width=10000 -c envelopes.create_partitions_in=$mode" \
                    "$PG_BIN/pgbench" -n -M prepared -h 127.0.0.1 -p "$PORT" -U postgres -c 8 -j 8 \
                    -T "$SECONDS_PER_RUN" -D node=$node -l --log-prefix="$OUT/lat" \
                    -f bench/sql/insert_crossing.sql bench >/dev/null 2>"$OUT/pgbench.err" \
                    || { cat "$OUT/pgbench.err" >&2; exit 1; }
                read -r p50 p99 max n < <(python3 bench/latency.py "$OUT"/lat.*)
                record crossing "p99_$variant" "$durability" "$run" "$p99" us
                record crossing "max_$variant" "$durability" "$run" "$max" us
                record crossing "p50_$variant" "$durability" "$run" "$p50" us
                log "crossing [$durability] $variant run $run: p50 ${p50}us p99 ${p99}us max ${max}us ($n inserts)"
            done
        done
        rm -f "$OUT"/lat.*
    fi

    if selected bridge && [ "$durability" = off ]; then
        # Bridge to JetStream: (1) drain a preloaded backlog, envelopes/s;
        # (2) commit -> bus latency at a fixed insert rate.
        if $quick; then backlog=50000; else backlog=500000; fi
        for run in $(seq "$RUNS"); do
            db="bridge_$run"
            stream="BENCH$$_$run" prefix="bench$$r$run"
            sql postgres -q -c "CREATE DATABASE $db"
            sql "$db" -q -c "CREATE EXTENSION pg_envelopes" -c "CREATE SEQUENCE bench_seq"
            sql "$db" -q -c "SET envelopes.notify = off" -c "SELECT envelopes.insert_gateway_envelopes(
                    array_agg((1 + s % 4)::int), array_agg(s), array_agg(pg_catalog.int4send(s::int % 16)),
                    array_agg(pg_catalog.convert_to(repeat('e', 200), 'UTF8')))
                  FROM generate_series(1::bigint, $backlog) s" >/dev/null
            sql "$db" -q -c "SELECT envelopes.consumer_register('bench')"
            url="postgres://postgres@127.0.0.1:$PORT/$db"
            started=$(date +%s.%N)
            "$BRIDGE" egress --database-url "$url" --name bench --sink "$NATS_URL" --batch-size 2000 \
                --nats-stream "$stream" --subject-prefix "$prefix" 2>"$OUT/bridge.log" &
            bridge=$!
            until [ "$(sql "$db" -At -c "SELECT envelopes_pending FROM envelopes.consumer_status WHERE consumer = 'bench'")" = 0 ]; do
                sleep 0.2
            done
            elapsed=$(python3 -c "print(f'{$(date +%s.%N) - $started:.2f}')")
            rate=$(python3 -c "print(f'{$backlog / $elapsed:.0f}')")
            record bridge throughput "$durability" "$run" "$rate" envelopes/s
            log "bridge [$durability] run $run: $backlog envelopes in ${elapsed}s = $rate/s"

            # Latency at a fixed rate of 1,000 single-row commits a second.
            n=$((SECONDS_PER_RUN * 1000))
            "$PROBE" "$NATS_URL" "$prefix" "$n" >"$OUT/probe.out" &
            probe=$!
            until grep -q ready "$OUT/probe.out" 2>/dev/null; do sleep 0.1; done
            "$PG_BIN/pgbench" -n -M prepared -h 127.0.0.1 -p "$PORT" -U postgres -c 4 -j 2 -R 1000 \
                -t $((n / 4)) -f bench/sql/insert_rate.sql "$db" >/dev/null 2>"$OUT/pgbench.err"
            wait "$probe"
            read -r p50 p99 max count < <(tail -n 1 "$OUT/probe.out")
            record bridge latency_p50_ms "$durability" "$run" "$p50" ms
            record bridge latency_p99_ms "$durability" "$run" "$p99" ms
            log "bridge [$durability] run $run: commit->bus p50 ${p50}ms p99 ${p99}ms max ${max}ms ($count messages)"
            kill -TERM "$bridge"; wait "$bridge" || true
            "$PROBE" "$NATS_URL" --delete "$stream"
            stream=""
            sql postgres -q -c "DROP DATABASE $db WITH (FORCE)"
        done
    fi

    if selected read && [ "$durability" = off ]; then
        # Cursor reads of 1,000 rows, 1 client: 50 leaf partitions (5 originators x
        # 10 bands) vs 5,000 (50 x 100; 1,000 = 50 x 20 with --quick), and the
        # selector vs a hand-written LATERAL query. The LATERAL query over 5,000
        # partitions takes about a minute, so it runs once per round there.
        if $quick; then big_bands=20; else big_bands=100; fi
        big=$((50 * big_bands))
        sql postgres -q -c "CREATE DATABASE read50" -c "CREATE DATABASE readbig"
        sql read50 -q -v nodes=5 -v bands=10 -f bench/sql/read_setup.sql
        sql readbig -q -v nodes=50 -v bands=$big_bands -f bench/sql/read_setup.sql
        for run in $(seq "$RUNS"); do
            for pair in read50:selector:50 readbig:selector:$big read50:lateral:50 readbig:lateral:$big; do
                IFS=: read -r db kind parts <<<"$pair"
                if [ "$kind:$parts" = "lateral:$big" ]; then
                    $quick && continue
                    started=$(date +%s.%N)
                    sql "$db" -q -f bench/sql/read_lateral.sql >/dev/null
                    tps=$(python3 -c "print(1 / ($(date +%s.%N) - $started))")
                else
                    tps=$(pgbench_tps "$db" 1 "bench/sql/read_$kind.sql")
                fi
                [ -n "$tps" ] || { cat "$OUT/pgbench.err" >&2; exit 1; }
                record read "${kind}_$parts" "$durability" "$run" "$tps" reads/s
                log "read [$durability] ${kind}_$parts run $run: $tps reads/s"
            done
        done
    fi

    cleanup
    trap - EXIT
done

{
    echo "command	$COMMAND"
    echo "date	$(date -u +%Y-%m-%dT%H:%MZ)"
    echo "machine	$(nproc) cores, $(free -g | awk '/^Mem:/ {print $2}') GiB RAM, $(uname -r)"
    echo "postgres	$("$PG_BIN/postgres" --version)"
    echo "runs	$RUNS x ${SECONDS_PER_RUN}s per variant, interleaved"
    for t in "${TUNING[@]}"; do echo "setting	$t"; done
} >"$OUT/meta.tsv"
"$REPORT_PYTHON" bench/report.py "$OUT" bench/RESULTS.md
log "wrote bench/RESULTS.md"
