#!/usr/bin/env bash
# Every benchmark of pg_envelopes, side by side in one run: each comparison's
# variants run interleaved (A B C A B C ...), several times each, on the same
# throwaway cluster, first with synchronous_commit = off (CPU-bound) and then on
# (durable); the report compares medians. Results go to bench/out/results.tsv and
# are rendered into bench/RESULTS.md and bench/results.png by bench/report.py.
#
# Comparisons: insert (single-row: extension, plain INSERT into pre-created
# partitions with and without ON CONFLICT DO NOTHING, unpartitioned tables, xmtpd's
# SAVEPOINT pattern, pg_partman; and the first three at 8 clients), batch (100
# rows: the same variants but pg_partman; the first three at 8 clients), inorder
# (the first three of each again, each client on its own originator, at 2 and 8
# clients), bulk
# (10,000-row calls: the batch function, COPY of meta and blob, the idempotent
# INSERT ... SELECT FROM unnest, driven by bridge/examples/bulk_load.rs),
# instructions (instructions per inserted row counted by callgrind,
# bench/instructions.sh), readinstr (instructions per call of each read function,
# bench/read_instructions.sh), routerinstr (the shard's instructions per call,
# straight vs through the router, bench/router_instructions.sh), notify (doorbell on/off, 2 and 8 writers),
# crossing (p99 latency crossing bands, worker vs transaction vs existing bands),
# premake (the same crossing with the bands created ahead by the maintenance
# worker vs on demand vs existing bands, on a cluster with pg_envelopes
# preloaded; and the cost of one maintenance run at 10 and 10,000 originators),
# prune (p99 latency of 8 writers while prune_expired drops 104 bands of their
# originators, in its worker or in one transaction, vs no pruning), view
# (xmtpd-shaped reads through gateway_envelopes_view vs a key-lookup form),
# shapes (xmtpd's read shapes: each read function vs the same read in plain SQL),
# xmtpd (every xmtpd read shape on its comparison's data set, 1,000,000- and
# 10,000-id bands: function, xmtpd layer, xmtpd's query generic and custom),
# read (1,000-row cursor read at 50 vs 5,000 leaf partitions, selector vs a
# hand-written LATERAL query), bridge (backlog drain rate and commit -> JetStream
# latency), sinks (every sink side by side: drain rate in 1,000-row batches and
# commit -> consumer latency at 1,000 commits/s), router (pg_envelopes_router
# over PL/Proxy and 4 shards: inserts through the proxy vs straight into the
# shard, reads through the router vs one node), refusals (per sink, a private bus
# that refuses rows over a size limit: refused rows set aside per minute, and an
# unrelated originator's commit -> consumer p99 with refused rows written beside
# it vs without), takeover (the time a standby bridge, egress and ingress, takes
# to acknowledge after the active one is killed), lagquery (the bridge's drain
# rate with its per-round lag query on vs off, and the query's cost at 10 and
# 10,000 originators), and for the change feed: feedcost (in-order single-row and 100-row
# inserts, this version vs a baseline build of an earlier commit running in a
# second cluster), latebridge (drain rate with 10% and 50% late arrivals vs in
# order), late (writers out of order: random-order single rows and a parallel
# backfill, extension vs the idempotent plain SQL),
# idle (an idle consumer poll and the idle bridge's CPU at 10, 1,000 and 10,000
# originators, this version and the baseline), horizon (commit -> bus latency of
# envelopes and outbox rows with and without an unrelated transaction held open
# in another database for the whole run), decoding (the table feed weighed against
# logical decoding on a wal_level = logical cluster: drain rate, the cost of an
# idle read after other databases wrote WAL, registering while a transaction runs
# elsewhere, and the inserts' cost of wal_level = logical).
#
# usage: bench/run.sh [--quick] [--only NAME[,NAME...]] [--baseline REF] [--durability off|on]
#   --quick     2 runs of 3 s per cell, durable variant only for insert and notify:
#               under 5 minutes, a smoke test of the numbers
#   --only      run only the named comparisons
#   --baseline  git ref of the baseline build for feedcost and idle (default: the
#               last commit before the change feed of 0.3.0)
#   --durability  only this synchronous_commit setting (default: off, then on)
# The Postgres is scripts/lib.sh's: ENVELOPES_PG_MAJOR=17 or 18 (or PG_CONFIG)
# for another major; a partial run on another major than 15 gets a section of
# its own in RESULTS.md.
# ENVELOPES_BENCH_RUNS and ENVELOPES_BENCH_SECONDS override the runs per variant
# and their length.
set -euo pipefail
COMMAND="bench/run.sh $*"
cd "$(dirname "$0")/.."
source scripts/lib.sh

quick=false only="" baseline_ref=c3945bd durabilities="off on"
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) quick=true ;;
        --only) only=$2; shift ;;
        --baseline) baseline_ref=$2; shift ;;
        --durability)
            case "${2:-}" in off|on) durabilities=$2 ;; *) echo "--durability: off or on" >&2; exit 2 ;; esac
            shift ;;
        *) echo "usage: $0 [--quick] [--only NAME[,NAME...]] [--baseline REF] [--durability off|on]" >&2; exit 2 ;;
    esac
    shift
done
if $quick; then RUNS=2 SECONDS_PER_RUN=3; else RUNS=5 SECONDS_PER_RUN=15; fi
# A run shorter than the full one but longer than --quick (recorded in the results).
RUNS=${ENVELOPES_BENCH_RUNS:-$RUNS}
SECONDS_PER_RUN=${ENVELOPES_BENCH_SECONDS:-$SECONDS_PER_RUN}

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
cargo build --quiet --release -p envelopes-bridge --bin envelopes-bridge --example latency_probe \
    --example bulk_load
BRIDGE=target/release/envelopes-bridge
PROBE=target/release/examples/latency_probe
BULK=target/release/examples/bulk_load
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
pgbench_tps() { pgbench_tps_on "$PORT" "$@"; }

# pgbench_tps_on PORT DB CLIENTS SCRIPT: the same against the cluster on PORT.
pgbench_tps_on() {
    local port=$1 db=$2 clients=$3 script=$4
    "$PG_BIN/pgbench" -n -M prepared -h 127.0.0.1 -p "$port" -U postgres \
        -c "$clients" -j "$clients" -T "$SECONDS_PER_RUN" -f "$script" "$db" 2>"$OUT/pgbench.err" \
        | awk '/^tps = / { print $3; exit }'
}

# drain_backlog DB STREAM PREFIX BACKLOG: starts the bridge on DB (consumer
# "bench", to JetStream) and waits until it has drained the backlog; sets $bridge
# (its pid: it keeps running), $elapsed (seconds) and $rate (envelopes/s).
drain_backlog() {
    local db=$1 stream=$2 prefix=$3 backlog=$4 started
    started=$(date +%s.%N)
    "$BRIDGE" egress --database-url "postgres://postgres@127.0.0.1:$PORT/$db" --name bench --register \
        --sink "$NATS_URL" --batch-size 2000 --nats-stream "$stream" --subject-prefix "$prefix" \
        2>"$OUT/bridge.log" &
    bridge=$!
    until [ "$(sql "$db" -At -c "SELECT envelopes_pending FROM envelopes.consumer_status WHERE consumer = 'bench'")" = 0 ]; do
        sleep 0.2
    done
    elapsed=$(python3 -c "print(f'{$(date +%s.%N) - $started:.2f}')")
    rate=$(python3 -c "print(f'{$backlog / $elapsed:.0f}')")
}

# cpu_ticks PID: user + system CPU time of a process so far, in clock ticks.
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

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
reset_tables() {
    if $partman; then sql "$1" -q -c "TRUNCATE partman_meta, partman_blob"; fi
    sql "$1" -q -f bench/sql/reset.sql >/dev/null
}

# On any exit: stop what this script started in the background (listener, bridge,
# probe), remove the benchmark's JetStream stream, stop the cluster and delete its
# files (gigabytes after a full run).
stream="" shards_dir=""
cleanup() {
    local pids
    pids=$(jobs -p)
    [ -z "$pids" ] || kill $pids 2>/dev/null || true
    if [ -n "$stream" ]; then "$PROBE" "$NATS_URL" --delete "$stream" >/dev/null 2>&1 || true; fi
    cluster_stop bench
    cluster_stop basebench
    cluster_stop logical
    cluster_stop premake
    [ -z "$shards_dir" ] || scripts/shards.sh down "$shards_dir" 2>/dev/null || true
    rm -rf "${ENVELOPES_TMP:?}/bench" "${ENVELOPES_TMP:?}/basebench" "${ENVELOPES_TMP:?}/logical" "${ENVELOPES_TMP:?}/premake"
}

# refusing_bus SINK: starts a private instance of that bus configured to refuse
# rows over a size limit, and sets $sink, $sink_args, $probe_args, $probe_prefix
# and $poison_size (bytes of an envelope it refuses) for it;
# stop_refusing_bus stops it.
refusing_bus() {
    local kind=$1 port dir
    port=$(free_port) dir="$ENVELOPES_TMP/refusing-$kind"
    rm -rf "$dir"; install -d "$dir"
    probe_prefix="bench$$refuse$kind" sink_args=(--subject-prefix "$probe_prefix") probe_args=()
    refusing_stop=""
    case "$kind" in
        jetstream)
            echo "max_payload: 8192" >"$dir/nats.conf"
            /usr/sbin/nats-server -a 127.0.0.1 -p "$port" -js -sd "$dir/store" -c "$dir/nats.conf" 2>"$dir/log" &
            refusing_pid=$! sink="nats://127.0.0.1:$port" poison_size=16384
            sink_args+=(--nats-stream "${probe_prefix^^}") ;;
        redis)
            redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
                --proto-max-bulk-len 1mb >"$dir/log" 2>&1 &
            refusing_pid=$! sink="redis://127.0.0.1:$port" poison_size=$((1100 * 1024))
            sink_args+=(--redis-stream "$probe_prefix"); probe_args=(--redis-stream "$probe_prefix") ;;
        mqtt)
            printf 'listener %s 127.0.0.1\nallow_anonymous true\nuser root\nmessage_size_limit 1000\n' "$port" >"$dir/m.conf"
            mosquitto -c "$dir/m.conf" >"$dir/log" 2>&1 &
            refusing_pid=$! sink="mqtt://127.0.0.1:$port" poison_size=2000 ;;
        rabbitmq)
            local dist node
            dist=$(free_port) node="refusing$$@localhost"
            printf 'listeners.tcp.default = 127.0.0.1:%s\nloopback_users.guest = true\nmax_message_size = 1048576\n' \
                "$port" >"$dir/rabbitmq.conf"
            echo "[]." >"$dir/plugins"; : >"$dir/rabbitmq-env.conf"
            refusing_env=(HOME="$dir" RABBITMQ_CONF_ENV_FILE="$dir/rabbitmq-env.conf" RABBITMQ_NODENAME="$node")
            env "${refusing_env[@]}" RABBITMQ_NODE_PORT="$port" RABBITMQ_DIST_PORT="$dist" \
                RABBITMQ_MNESIA_BASE="$dir/mnesia" RABBITMQ_LOG_BASE="$dir/logs" \
                RABBITMQ_ENABLED_PLUGINS_FILE="$dir/plugins" RABBITMQ_CONFIG_FILE="$dir/rabbitmq.conf" \
                /usr/lib/rabbitmq/bin/rabbitmq-server >"$dir/log" 2>&1 &
            refusing_pid=$! sink="amqp://guest:guest@127.0.0.1:$port/%2f" poison_size=$((1100 * 1024))
            refusing_stop="env ${refusing_env[*]} /usr/lib/rabbitmq/bin/rabbitmqctl -n $node stop"
            sink_args+=(--amqp-exchange "$probe_prefix"); probe_args=(--amqp-exchange "$probe_prefix") ;;
        webhook)
            # The probe is the receiver (bodies are JSON, bytes in hex: twice
            # their size): a refused row is over the limit alone.
            refusing_pid="" sink="http://127.0.0.1:$port/hook" poison_size=65536
            probe_args=(--max-body 65536) ;;
    esac
    if [ -n "$refusing_pid" ]; then
        for _ in $(seq 600); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.2; done
    fi
}
stop_refusing_bus() {
    [ -z "$refusing_stop" ] || $refusing_stop >/dev/null 2>&1 || true
    [ -z "$refusing_pid" ] || { kill "$refusing_pid" 2>/dev/null; wait "$refusing_pid" 2>/dev/null || true; }
    refusing_pid="" refusing_stop=""
}

# The baseline cluster (an earlier commit's extension, see bench/baseline.sh),
# started next to the current one for the comparisons that need it.
BASE_PORT=""
start_baseline() {
    [ -z "$BASE_PORT" ] || return 0
    local bin
    bin=$(bench/baseline.sh "$baseline_ref" "$ENVELOPES_TMP/baseline")
    BASE_PORT=$(free_port)
    PG_BIN=$bin cluster_start basebench "$BASE_PORT" "${TUNING[@]}" "synchronous_commit = $durability"
    log "baseline cluster (pg_envelopes at $baseline_ref) on port $BASE_PORT"
}

for durability in $durabilities; do
    if $quick && [ "$durability" = on ]; then only_here=insert,notify; else only_here=""; fi
    PORT=$(free_port)
    cluster_start bench "$PORT" "${TUNING[@]}" "synchronous_commit = $durability"
    trap cleanup EXIT
    log "cluster on port $PORT, synchronous_commit = $durability; settings:"
    for t in "${TUNING[@]}"; do log "  $t"; done
    sql postgres -q -c "CREATE DATABASE bench"
    sql bench -q -f bench/sql/setup.sql >/dev/null
    # pg_partman, a peer in the insert comparison, where it is installed (Debian
    # packages it for 15 here; the 17 and 18 built from source have none).
    partman=false partman_variant=()
    if [ "$(sql bench -At -c "SELECT count(*) FROM pg_catalog.pg_available_extensions WHERE name = 'pg_partman'")" = 1 ]; then
        sql bench -q -f bench/sql/setup_partman.sql >/dev/null
        partman=true partman_variant=(partman=bench/sql/insert_partman.sql)
    else
        log "pg_partman is not installed for $("$PG_BIN/postgres" --version): the insert comparison goes without it"
    fi

    if selected insert; then
        # Single-row inserts, 2 clients: the extension's function; a plain INSERT of
        # meta and blob into the same pre-created partitions, without and with
        # ON CONFLICT DO NOTHING; the same into unpartitioned tables; xmtpd's
        # SAVEPOINT pattern; pg_partman's premade partitions.
        interleave insert "$durability" 2 bench \
            extension=bench/sql/insert_extension.sql plain=bench/sql/insert_plain.sql \
            plain_idempotent=bench/sql/insert_plain_idempotent.sql \
            flat=bench/sql/insert_flat.sql savepoint=bench/sql/insert_savepoint.sql \
            "${partman_variant[@]}"
        interleave insert8 "$durability" 8 bench \
            extension=bench/sql/insert_extension.sql plain=bench/sql/insert_plain.sql \
            plain_idempotent=bench/sql/insert_plain_idempotent.sql
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
        interleave batch8 "$durability" 8 bench \
            extension=bench/sql/batch_extension.sql plain=bench/sql/batch_plain.sql \
            plain_idempotent=bench/sql/batch_plain_idempotent.sql
    fi

    if selected inorder; then
        # The same single-row and 100-row inserts in order: each client writes its
        # own originator, as each xmtpd node writes its own. In the insert and
        # batch cells clients pick originators at random and draw ids from one
        # sequence, so a row often commits below an id another client committed
        # first: a late arrival, which the extension must flag and record (and
        # the plain INSERTs do not).
        for clients in 2 8; do
            interleave "inorder$clients" "$durability" "$clients" bench \
                extension=bench/sql/inorder_extension.sql plain=bench/sql/inorder_plain.sql \
                plain_idempotent=bench/sql/inorder_plain_idempotent.sql
            interleave "inorder_batch$clients" "$durability" "$clients" bench \
                extension=bench/sql/inorder_batch_extension.sql \
                plain=bench/sql/inorder_batch_plain.sql \
                plain_idempotent=bench/sql/inorder_batch_plain_idempotent.sql
        done
    fi

    if selected late; then
        # Writers out of order, against the idempotent plain SQL doing the same
        # work into the same pre-created partitions: single rows at random ids
        # of each client's own originator (almost all of them late arrivals), at
        # 2 and 8 clients; and a parallel backfill of one originator, each client
        # inserting 100-row batches of its own ascending range, the ranges
        # growing side by side (all but the highest client's rows late), at 4
        # and 8 clients.
        for clients in 2 8; do
            interleave "late$clients" "$durability" "$clients" bench \
                extension=bench/sql/late_extension.sql \
                plain_idempotent=bench/sql/late_plain_idempotent.sql
        done
        for clients in 4 8; do
            interleave "backfill$clients" "$durability" "$clients" bench \
                extension=bench/sql/backfill_extension.sql \
                plain_idempotent=bench/sql/backfill_plain_idempotent.sql
        done
    fi

    if selected bulk; then
        # 10,000-row calls, 2 clients, each client its own originator: the batch
        # function; COPY of meta then blob in one transaction (the fastest way
        # into these tables Postgres has, not idempotent); the idempotent
        # INSERT ... SELECT FROM unnest(...) ON CONFLICT DO NOTHING.
        for run in $(seq "$RUNS"); do
            for variant in extension copy insert_idempotent; do
                reset_tables bench
                rate=$("$BULK" "host=127.0.0.1 port=$PORT user=postgres dbname=bench" \
                    "$variant" 2 "$SECONDS_PER_RUN" 10000)
                record bulk "$variant" "$durability" "$run" "$rate" rows/s
                log "bulk [$durability] $variant run $run: $rate rows/s"
            done
        done
    fi

    if selected instructions && [ "$durability" = off ]; then
        # Instructions per inserted row (callgrind, single-user backend): exact,
        # so one run each.
        bench/instructions.sh "$OUT/instructions.tsv"
        while IFS=$'\t' read -r variant per_row; do
            record instructions "$variant" "$durability" 1 "$per_row" instructions/row
        done <"$OUT/instructions.tsv"
    fi

    if selected readinstr && [ "$durability" = off ]; then
        # Instructions per call of each read function (callgrind, single-user
        # backend, bench/read_instructions.sh): exact, so one run each.
        bench/read_instructions.sh "$OUT/read_instructions.tsv"
        while IFS=$'\t' read -r variant per_call; do
            record readinstr "$variant" "$durability" 1 "$per_call" instructions/call
        done <"$OUT/read_instructions.tsv"
    fi

    if selected routerinstr && [ "$durability" = off ]; then
        # The shard's instructions per call, straight vs through the router
        # (callgrind, bench/router_instructions.sh): exact, so one run each.
        BULK=$BULK bench/router_instructions.sh "$OUT/router_instructions.tsv"
        while IFS=$'\t' read -r variant per_call; do
            record "routerinstr_${variant%_*}" "${variant##*_}" "$durability" 1 "$per_call" instructions/call
        done <"$OUT/router_instructions.tsv"
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
                    sql bench -q -c "SELECT envelopes.ensure_gateway_parts($node, b * 10000 + 1, 10000)
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

    if selected premake; then
        # The crossing above with the bands created ahead: 8 writers into one
        # originator crossing a band every 10,000 ids, on a second cluster with
        # pg_envelopes preloaded. ondemand: the maintenance worker off, each band
        # created by the writer that first needs it (in a worker, the default);
        # premake: the maintenance worker on, every second, with
        # premake_fraction 0 (one band always ahead: at ~10,000 inserts/s a band
        # of 10,000 ids lasts about one interval, so the next band must be made
        # as soon as the newest has a row for a run to come in time); steady:
        # every band created beforehand.
        # Each run a fresh originator whose first band exists, so the only
        # creations are crossings. Then (synchronous_commit = off only) the time
        # of one maintenance run with nothing to do, at 10 and 10,000
        # originators: the run every interval costs, read from
        # envelopes.maintenance_runs.
        MPORT=$(free_port)
        cluster_start premake "$MPORT" "${TUNING[@]}" "synchronous_commit = $durability" \
            "shared_preload_libraries = 'pg_envelopes'" "envelopes.maintenance_databases = 'bench'" \
            "envelopes.premake_fraction = 0" "envelopes.band_width = 10000" "max_worker_processes = 16"
        msql() { cluster_psql premake "$MPORT" "$@"; }
        maintenance() { # maintenance SECONDS DATABASES: the worker's interval (0: off) and databases
            msql postgres -q -o /dev/null -c "ALTER SYSTEM SET envelopes.maintenance_interval = $1" \
                -c "ALTER SYSTEM SET envelopes.maintenance_databases = '$2'" -c "SELECT pg_reload_conf()"
            sleep 1
        }
        msql postgres -q -c "CREATE DATABASE bench"
        msql bench -q -f bench/sql/setup.sql >/dev/null
        msql bench -q -c "CREATE SEQUENCE IF NOT EXISTS crossing_seq"
        node=100
        for run in $(seq "$RUNS"); do
            for variant in ondemand premake steady; do
                node=$((node + 1))
                msql bench -q -c "ALTER SEQUENCE crossing_seq RESTART WITH 1"
                last=1; [ "$variant" = steady ] && last=200
                msql bench -q -c "SELECT envelopes.ensure_gateway_parts($node, b * 10000 + 1)
                                   FROM generate_series(0, $((last - 1))) b" >/dev/null
                if [ "$variant" = premake ]; then maintenance 1 bench; else maintenance 0 bench; fi
                rm -f "$OUT"/lat.*
                "$PG_BIN/pgbench" -n -M prepared -h 127.0.0.1 -p "$MPORT" -U postgres -c 8 -j 8 \
                    -T "$SECONDS_PER_RUN" -D node=$node -l --log-prefix="$OUT/lat" \
                    -f bench/sql/insert_crossing.sql bench >/dev/null 2>"$OUT/pgbench.err" \
                    || { cat "$OUT/pgbench.err" >&2; exit 1; }
                read -r p50 p99 max n < <(python3 bench/latency.py "$OUT"/lat.*)
                bands=$(msql bench -At -c "SELECT count(*) FROM envelopes._bands() WHERE originator_node_id = $node")
                record premake "p99_$variant" "$durability" "$run" "$p99" us
                record premake "max_$variant" "$durability" "$run" "$max" us
                record premake "p50_$variant" "$durability" "$run" "$p50" us
                log "premake [$durability] $variant run $run: p50 ${p50}us p99 ${p99}us max ${max}us ($n inserts, $bands bands)"
            done
        done
        maintenance 0 bench
        rm -f "$OUT"/lat.*
        if [ "$durability" = off ]; then
            for n in 10 10000; do
                db="maint_$n"
                msql postgres -q -c "CREATE DATABASE $db"
                msql "$db" -q -c "CREATE EXTENSION pg_envelopes"
                for first in $(seq 1 500 "$n"); do
                    last=$((first + 499 < n ? first + 499 : n))
                    msql "$db" -q -c "SET envelopes.create_partitions_in = transaction" -c "SET envelopes.notify = off" \
                        -c "SET envelopes.max_new_partitions_per_call = 1000" \
                        -c "SELECT envelopes.insert_gateway_envelopes(array_agg(g::int), array_agg(1::bigint),
                              array_agg('\x01'::bytea), array_agg('\x02'::bytea)) FROM generate_series($first, $last) g" >/dev/null
                done
                # The cost of a run with nothing to create: premake_fraction 0.8
                # (at 0, the crossing's setting, the first run would create a band
                # for every originator, 20,000 tables, which is not the recurring
                # cost); the first run is left out below.
                msql postgres -q -o /dev/null -c "ALTER SYSTEM SET envelopes.premake_fraction = 0.8"
                maintenance 1 "$db"
                until [ "$(msql "$db" -At -c "SELECT count(*) FROM envelopes.maintenance_runs WHERE finished IS NOT NULL")" -gt "$RUNS" ]; do
                    sleep 0.5
                done
                maintenance 0 "$db"
                # The first run is left out (it may have met a cold cache).
                msql "$db" -At -F ' ' -c "SELECT row_number() OVER (ORDER BY run_id),
                        round(extract(epoch FROM finished - started) * 1000, 2), coalesce(error, '')
                          FROM (SELECT * FROM envelopes.maintenance_runs WHERE finished IS NOT NULL
                                 ORDER BY run_id OFFSET 1 LIMIT $RUNS) r" >"$OUT/maint.txt"
                while read -r run ms error; do
                    [ -z "$error" ] || { log "maintenance run failed: $error"; exit 1; }
                    record maintcost "originators_$n" "$durability" "$run" "$ms" ms
                    log "maintcost [$durability] one run at $n originators run $run: $ms ms"
                done <"$OUT/maint.txt"
                msql postgres -q -c "DROP DATABASE $db WITH (FORCE)"
                msql postgres -q -o /dev/null -c "ALTER SYSTEM RESET envelopes.premake_fraction"
            done
        fi
        cluster_stop premake
    fi

    if selected prune && [ "$durability" = off ]; then
        # 8 writers, each into an originator of its own, into bands that exist;
        # 3 s into the run prune_expired drops 104 expired bands of those same
        # originators (13 each, one expired row in each), in its worker (a commit
        # per band) or in one transaction; against the same load with no prune.
        # Each run uses fresh originators.
        sql bench -q -c "CREATE SEQUENCE IF NOT EXISTS prune_seq"
        base=1000
        for run in $(seq "$RUNS"); do
            for variant in steady worker transaction; do
                base=$((base + 10))
                sql bench -q -c "ALTER SEQUENCE prune_seq RESTART WITH 10000000" \
                    -c "SELECT envelopes.ensure_gateway_parts(n, k * 10000 + 1, 10000),
                               envelopes.insert_gateway_envelope(n, k * 10000 + 1, '\\x01', '\\x02', expiry => 1)
                          FROM generate_series($base, $base + 7) n, generate_series(0, 12) k" \
                    -c "SELECT envelopes.ensure_gateway_parts(n, 10000000, 10000000)
                          FROM generate_series($base, $base + 7) n" >/dev/null
                rm -f "$OUT"/lat.*
                "$PG_BIN/pgbench" -n -M prepared -h 127.0.0.1 -p "$PORT" -U postgres -c 8 -j 8 \
                    -T "$SECONDS_PER_RUN" -D node_base=$base -l --log-prefix="$OUT/lat" \
                    -f bench/sql/insert_prune.sql bench >/dev/null 2>"$OUT/pgbench.err" &
                writers=$!
                dropped=-
                if [ "$variant" != steady ]; then
                    sleep 3
                    in_tx=false
                    [ "$variant" = transaction ] && in_tx=true
                    dropped=$(sql bench -At -c "SELECT count(*) FILTER (WHERE dropped)
                        FROM envelopes.prune_expired(in_transaction => $in_tx)")
                fi
                wait "$writers" || { cat "$OUT/pgbench.err" >&2; exit 1; }
                read -r p50 p99 max n < <(python3 bench/latency.py "$OUT"/lat.*)
                record prune "p99_$variant" "$durability" "$run" "$p99" us
                record prune "max_$variant" "$durability" "$run" "$max" us
                record prune "p50_$variant" "$durability" "$run" "$p50" us
                log "prune [$durability] $variant run $run: p50 ${p50}us p99 ${p99}us max ${max}us ($n inserts, $dropped bands dropped)"
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
            drain_backlog "$db" "$stream" "$prefix" "$backlog"
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

    if selected sinks && [ "$durability" = off ]; then
        # Every sink side by side, each read by the probe with that bus's own client
        # (bridge/examples/latency_probe.rs; for the webhook the probe is the
        # receiver): (1) a preloaded backlog drained in 1,000-row batches,
        # envelopes/s; (2) commit -> consumer latency at 1,000 single-row commits a
        # second. A fresh database per sink and run; the sinks' order rotates.
        if $quick; then backlog=20000; else backlog=100000; fi
        # mqtt is the shared mosquitto with its defaults: max_inflight_messages
        # 20, announced as the Receive Maximum (at most 20 QoS 1 PUBLISHes
        # await their PUBACK), and set_tcp_nodelay false (its PUBACKs and
        # deliveries wait behind Nagle's algorithm for the peer's delayed ACK).
        # Two private mosquittos show what each costs: mqtt_nodelay sets
        # set_tcp_nodelay true only; mqtt_tuned also raises max_inflight_messages
        # to 1,000 (and max_queued_messages, so that the probe's own QoS 1
        # subscription drops nothing).
        mqtt_pids=() mqtt_dirs=()
        for variant in nodelay tuned; do
            mport=$(free_port) mdir="$ENVELOPES_TMP/mqtt-$variant"
            rm -rf "$mdir"; install -d "$mdir"
            {
                printf 'listener %s 127.0.0.1\nallow_anonymous true\nuser root\npersistence false\n' "$mport"
                echo "set_tcp_nodelay true"
                if [ "$variant" = tuned ]; then printf 'max_inflight_messages 1000\nmax_queued_messages 200000\n'; fi
            } >"$mdir/m.conf"
            mosquitto -c "$mdir/m.conf" >"$mdir/log" 2>&1 &
            mqtt_pids+=($!) mqtt_dirs+=("$mdir")
            for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$mport") 2>/dev/null && break; sleep 0.1; done
            if [ "$variant" = nodelay ]; then mqtt_nodelay_port=$mport; else mqtt_tuned_port=$mport; fi
        done
        sinks=(jetstream redis mqtt mqtt_nodelay mqtt_tuned rabbitmq webhook jsonl)
        for run in $(seq "$RUNS"); do
            for i in "${!sinks[@]}"; do
                sink_name=${sinks[$(((i + run) % ${#sinks[@]}))]}
                db="sink_${sink_name}_$run" name="bench$$r${run}${sink_name}"
                sink_args=(--subject-prefix "$name") probe_args=() leftover=""
                case "$sink_name" in
                    jetstream) sink=$NATS_URL; sink_args+=(--nats-stream "${name^^}"); leftover=${name^^} ;;
                    redis) sink=redis://127.0.0.1:6379; sink_args+=(--redis-stream "$name")
                        probe_args=(--redis-stream "$name"); leftover=$name ;;
                    mqtt) sink=mqtt://127.0.0.1:1883 ;;
                    mqtt_nodelay) sink=mqtt://127.0.0.1:$mqtt_nodelay_port ;;
                    mqtt_tuned) sink=mqtt://127.0.0.1:$mqtt_tuned_port ;;
                    rabbitmq) sink="amqp://guest:guest@127.0.0.1:5672/%2f"
                        sink_args+=(--amqp-exchange "$name"); probe_args=(--amqp-exchange "$name")
                        leftover=$name ;;
                    webhook) sink="http://127.0.0.1:$(free_port)/hook" ;;
                    jsonl) sink="jsonl:$OUT/$name.jsonl" ;;
                esac
                sql postgres -q -c "CREATE DATABASE $db"
                sql "$db" -q -c "CREATE EXTENSION pg_envelopes" -c "CREATE SEQUENCE bench_seq"
                sql "$db" -q -c "SET envelopes.notify = off" -c "SELECT envelopes.insert_gateway_envelopes(
                        array_agg((1 + s % 4)::int), array_agg(s), array_agg(pg_catalog.int4send(s::int % 16)),
                        array_agg(pg_catalog.convert_to(repeat('e', 200), 'UTF8')))
                      FROM generate_series(1::bigint, $backlog) s" >/dev/null
                sql "$db" -q -c "SELECT envelopes.consumer_register('bench')"
                "$PROBE" "$sink" "$name" "$backlog" "${probe_args[@]}" >"$OUT/probe.out" &
                probe=$!
                until grep -q ready "$OUT/probe.out" 2>/dev/null; do sleep 0.1; done
                started=$(date +%s.%N)
                "$BRIDGE" egress --database-url "postgres://postgres@127.0.0.1:$PORT/$db" --name bench --register \
                    --sink "$sink" --batch-size 1000 "${sink_args[@]}" 2>"$OUT/bridge.log" &
                bridge=$!
                # Done when the consumer has every message and the bridge has
                # acknowledged them all. The pending count is only asked once
                # the probe is done: it walks the whole backlog, and asking it
                # every 100 ms while the bridge drains took 5-10% off the rate
                # it measured.
                wait "$probe" || true
                until [ "$(sql "$db" -At -c "SELECT envelopes_pending FROM envelopes.consumer_status WHERE consumer = 'bench'")" = 0 ]; do
                    sleep 0.02
                done
                rate=$(python3 -c "print(f'{$backlog / ($(date +%s.%N) - $started):.0f}')")
                record sinks_drain "$sink_name" "$durability" "$run" "$rate" envelopes/s
                log "sinks [$durability] $sink_name run $run: drained $backlog envelopes at $rate/s"

                n=$((SECONDS_PER_RUN * 1000))
                "$PROBE" "$sink" "$name" "$n" "${probe_args[@]}" >"$OUT/probe.out" &
                probe=$!
                until grep -q ready "$OUT/probe.out" 2>/dev/null; do sleep 0.1; done
                "$PG_BIN/pgbench" -n -M prepared -h 127.0.0.1 -p "$PORT" -U postgres -c 4 -j 2 -R 1000 \
                    -t $((n / 4)) -f bench/sql/insert_rate.sql "$db" >/dev/null 2>"$OUT/pgbench.err"
                wait "$probe"
                read -r p50 p99 max count < <(tail -n 1 "$OUT/probe.out")
                record sinks_p50_ms "$sink_name" "$durability" "$run" "$p50" ms
                record sinks_p99_ms "$sink_name" "$durability" "$run" "$p99" ms
                log "sinks [$durability] $sink_name run $run: commit->consumer p50 ${p50}ms p99 ${p99}ms max ${max}ms ($count messages)"
                kill -TERM "$bridge"; wait "$bridge" || true
                bridge=""
                [ -n "$leftover" ] && "$PROBE" "$sink" --delete "$leftover"
                rm -f "$OUT/$name.jsonl"
                sql postgres -q -c "DROP DATABASE $db WITH (FORCE)"
            done
        done
        kill "${mqtt_pids[@]}" 2>/dev/null; wait "${mqtt_pids[@]}" 2>/dev/null || true
        rm -rf "${mqtt_dirs[@]}"
    fi

    if selected refusals && [ "$durability" = off ]; then
        # What rows a bus refuses cost the rest, per sink, each bus a private
        # instance configured to refuse (refusing_bus below): (1) how many refused
        # rows a minute the bridge sets aside, a preloaded backlog of them drained
        # with the default --dead-letter-after; (2) commit -> consumer latency of an
        # unrelated originator's rows at 200 commits/s while 5 refused rows a
        # second are written beside them ("poison"), while 100 refused rows
        # committed at once as the run starts are set aside ("burst"), and
        # without them ("clean"), interleaved.
        for run in $(seq "$RUNS"); do
            for sink_name in jetstream redis mqtt rabbitmq webhook; do
                refusing_bus "$sink_name"
                db="refuse_${sink_name}_$run"
                sql postgres -q -c "CREATE DATABASE $db"
                sql "$db" -q -c "CREATE EXTENSION pg_envelopes" -c "CREATE SEQUENCE bench_seq" \
                    -c "CREATE SEQUENCE poison_seq"
                backlog=200
                sql "$db" -q -c "SET envelopes.notify = off" -c "SELECT envelopes.insert_gateway_envelope(1, s, '\\x01',
                        pg_catalog.decode(pg_catalog.repeat('ab', $poison_size), 'hex'))
                      FROM generate_series(1, $backlog) s" >/dev/null
                sql "$db" -q -c "SELECT setval('poison_seq', $backlog)" -c "SELECT envelopes.consumer_register('bench')"
                receiver=""
                if [ "$sink_name" = webhook ]; then
                    "$PROBE" "$sink" "$probe_prefix" 1000000000 --idle-secs 3600 "${probe_args[@]}" \
                        >"$OUT/receiver.out" &
                    receiver=$!
                    until grep -q ready "$OUT/receiver.out" 2>/dev/null; do sleep 0.1; done
                fi
                started=$(date +%s.%N)
                "$BRIDGE" egress --database-url "postgres://postgres@127.0.0.1:$PORT/$db" --name bench --register \
                    --sink "$sink" --batch-size 1000 "${sink_args[@]}" 2>"$OUT/bridge.log" &
                bridge=$!
                deadline=$((SECONDS + 600))
                until [ "$(sql "$db" -At -c "SELECT count(*) FROM envelopes.dead_letters")" -ge "$backlog" ]; do
                    [ "$SECONDS" -le "$deadline" ] || { log "refusals: $sink_name did not set the rows aside"; exit 1; }
                    sleep 0.05
                done
                per_minute=$(python3 -c "print(f'{$backlog * 60 / ($(date +%s.%N) - $started):.0f}')")
                [ -z "$receiver" ] || { kill "$receiver"; wait "$receiver" 2>/dev/null || true; }
                record refusals_set_aside "$sink_name" "$durability" "$run" "$per_minute" rows/min
                log "refusals [$durability] $sink_name run $run: $backlog refused rows set aside at $per_minute/min"
                for variant in poison burst clean; do
                    n=$((SECONDS_PER_RUN * 200))
                    "$PROBE" "$sink" "$probe_prefix" "$n" "${probe_args[@]}" >"$OUT/probe.out" &
                    probe=$!
                    until grep -q ready "$OUT/probe.out" 2>/dev/null; do sleep 0.1; done
                    writers=()
                    if [ "$variant" = poison ]; then
                        "$PG_BIN/pgbench" -n -M prepared -h 127.0.0.1 -p "$PORT" -U postgres -c 1 -j 1 -R 5 \
                            -T "$SECONDS_PER_RUN" -D size="$poison_size" -f bench/sql/poison_rate.sql "$db" \
                            >/dev/null 2>"$OUT/pgbench-poison.err" &
                        writers+=($!)
                    elif [ "$variant" = burst ]; then
                        sql "$db" -q -c "SELECT envelopes.insert_gateway_envelope(1, nextval('poison_seq'), '\\x01',
                                pg_catalog.decode(pg_catalog.repeat('ab', $poison_size), 'hex'))
                              FROM generate_series(1, 100)" >/dev/null &
                        writers+=($!)
                    fi
                    "$PG_BIN/pgbench" -n -M prepared -h 127.0.0.1 -p "$PORT" -U postgres -c 2 -j 2 -R 200 \
                        -t $((n / 2)) -f bench/sql/insert_rate.sql "$db" >/dev/null 2>"$OUT/pgbench.err"
                    wait "$probe"
                    for w in "${writers[@]}"; do wait "$w" || true; done
                    read -r p50 p99 max count < <(tail -n 1 "$OUT/probe.out")
                    record refusals_p99_ms "${sink_name}_$variant" "$durability" "$run" "$p99" ms
                    log "refusals [$durability] $sink_name $variant run $run: unrelated rows commit->consumer p50 ${p50}ms p99 ${p99}ms max ${max}ms ($count messages)"
                done
                kill -TERM "$bridge"; wait "$bridge" || true
                bridge=""
                stop_refusing_bus
                sql postgres -q -c "DROP DATABASE $db WITH (FORCE)"
            done
        done
    fi

    if selected takeover && [ "$durability" = off ]; then
        # How long a standby takes over: two bridges under one name, the active
        # one killed with SIGKILL while rows flow (500 commits/s); the time from
        # the kill to the standby's first acknowledgement (egress: the consumer's
        # acked_at; ingress, fed by an egress bridge into a stream of its own: the
        # ingress position's updated_at).
        for run in $(seq "$RUNS"); do
            for side in egress ingress; do
                db="takeover_${side}_$run" name="bench$$t${run}$side"
                sql postgres -q -c "CREATE DATABASE $db"
                sql "$db" -q -c "CREATE EXTENSION pg_envelopes" -c "CREATE SEQUENCE bench_seq" \
                    -c "SELECT envelopes.consumer_register('bench')"
                "$PG_BIN/pgbench" -n -M prepared -h 127.0.0.1 -p "$PORT" -U postgres -c 2 -j 2 -R 500 \
                    -T $((SECONDS_PER_RUN + 10)) -f bench/sql/insert_rate.sql "$db" >/dev/null 2>"$OUT/pgbench.err" &
                writer=$!
                pids=()
                if [ "$side" = egress ]; then
                    for instance in a b; do
                        "$BRIDGE" egress --database-url "postgres://postgres@127.0.0.1:$PORT/$db" --name bench --register \
                            --sink "jsonl:$OUT/$name.$instance.jsonl" 2>"$OUT/bridge-$instance.log" &
                        pids+=($!)
                        sleep 1
                    done
                    probe_sql="SELECT COALESCE(extract(epoch FROM acked_at), 0) FROM envelopes.consumers WHERE name = 'bench'"
                    target=$db
                else
                    stream=${name^^}
                    sql postgres -q -c "CREATE DATABASE ${db}_in"
                    sql "${db}_in" -q -c "CREATE EXTENSION pg_envelopes"
                    "$BRIDGE" egress --database-url "postgres://postgres@127.0.0.1:$PORT/$db" --name bench --register \
                        --sink "$NATS_URL" --nats-stream "$stream" --subject-prefix "$name" 2>"$OUT/bridge-feed.log" &
                    feeder=$!
                    sleep 1
                    for instance in a b; do
                        "$BRIDGE" ingress --database-url "postgres://postgres@127.0.0.1:$PORT/${db}_in" --name in \
                            --source "$NATS_URL" --nats-stream "$stream" --subject "$name.envelope.>" \
                            2>"$OUT/bridge-$instance.log" &
                        pids+=($!)
                        sleep 1
                    done
                    probe_sql="SELECT COALESCE(max(extract(epoch FROM updated_at)), 0) FROM envelopes.ingress_positions WHERE consumer = 'in'"
                    target=${db}_in
                fi
                sleep "$SECONDS_PER_RUN"
                killed=$(date +%s.%N)
                kill -KILL "${pids[0]}"
                until python3 -c "import sys; sys.exit(0 if $(sql "$target" -At -c "$probe_sql") > $killed else 1)"; do
                    sleep 0.01
                done
                ms=$(python3 -c "print(f'{($(sql "$target" -At -c "$probe_sql") - $killed) * 1000:.0f}')")
                record takeover_ms "$side" "$durability" "$run" "$ms" ms
                log "takeover [$durability] $side run $run: the standby acknowledged ${ms} ms after the active one was killed"
                kill -TERM "${pids[1]}"; wait "${pids[1]}" || true
                kill "$writer" 2>/dev/null || true; wait "$writer" 2>/dev/null || true
                if [ "$side" = ingress ]; then
                    kill -TERM "$feeder"; wait "$feeder" || true
                    "$PROBE" "$NATS_URL" --delete "$stream"
                    stream=""
                    sql postgres -q -c "DROP DATABASE ${db}_in WITH (FORCE)"
                fi
                rm -f "$OUT/$name".*.jsonl
                sql postgres -q -c "DROP DATABASE $db WITH (FORCE)"
            done
        done
    fi

    if { selected router || selected routerpin; } && [ "$durability" = off ]; then
        # The router's cost (pg_envelopes_router over PL/Proxy, scripts/shards.sh
        # up 4): single-row and 100-row inserts through the proxy vs straight into
        # the shard that owns the originators (all on shard 0, so both variants
        # write into the same tables); and 1,000-row reads through the router
        # over 4 shards vs one node holding the same rows (on shard 0's server).
        #   router:    everything shares this machine's two cores (2 clients for
        #              inserts, 1 for reads): the proxy's work takes CPU from the
        #              shard it feeds, as it would not on a machine of its own.
        #   routerpin: per-shard figures: every shard server runs on CPU 1, the
        #              proxy and pgbench on CPU 0 (taskset), as a proxy tier and
        #              a shard on machines of their own; 4 clients, reads return
        #              their rows to the client in both forms. Also recorded:
        #              how busy each CPU was, and CPU 0's time per call (pgbench
        #              alone when direct, pgbench and the proxy when routed).
        shards_dir=$(ENVELOPES_SHARDS_OWNER=$$ ENVELOPES_SHARDS_INSTALL=0 scripts/shards.sh up 4)
        source "$shards_dir/env"
        shard0=${SHARD_PORTS[0]}
        for p in "${SHARD_PORTS[@]}" "$PROXY_PORT"; do
            cluster_psql x "$p" postgres -q -c "ALTER SYSTEM SET synchronous_commit = off" \
                -c "SELECT pg_reload_conf()" >/dev/null
        done
        # Originators 1..200 that the map gives shard 0, as a pgbench CASE.
        mapfile -t mine < <(cluster_psql x "$PROXY_PORT" envelopes -At -c "
            SELECT o FROM generate_series(1, 200) o
             WHERE envelopes_router.shard_of(o) = (SELECT shard FROM envelopes_router.partition_map WHERE partition = 0)
             ORDER BY o LIMIT 8")
        pick="\\set i random(0, $((${#mine[@]} - 1)))"$'\n'"\\set node case"
        for k in "${!mine[@]}"; do pick+=" when :i = $k then ${mine[$k]}"; done
        pick+=" end"
        for kind in insert batch; do
            { echo "$pick"; grep -v '^\\set node' "bench/sql/${kind}_extension.sql"; } >"$OUT/router_$kind.sql"
        done
        # router_cell KIND VARIANT PORT DB CLIENTS [COMPARISON]: one run of
        # $OUT/router_KIND.sql, recorded under COMPARISON (router_KIND).
        router_cell() {
            local tps
            tps=$(pgbench_tps_on "$3" "$4" "$5" "$OUT/router_$1.sql")
            [ -n "$tps" ] || { cat "$OUT/pgbench.err" >&2; exit 1; }
            record "${6:-router_$1}" "$2" "$durability" "$run" "$tps" tps
            log "${6:-router_$1} [$durability] $2 run $run: $tps tps"
        }
        cluster_psql x "$shard0" envelopes -q -c "CREATE SEQUENCE bench_seq"
        cluster_psql x "$PROXY_PORT" envelopes -q -c "CREATE SEQUENCE bench_seq START 1000000000000"
        if selected router; then
            for run in $(seq "$RUNS"); do
                for kind in insert batch; do
                    router_cell "$kind" direct "$shard0" envelopes 2
                    router_cell "$kind" proxy "$PROXY_PORT" envelopes 2
                done
            done
        fi
        # Reads: 64 originators x 2,000 rows, through the router and on one node.
        load="SELECT envelopes.insert_gateway_envelopes(array_agg(o), array_agg(s),
                  array_agg(pg_catalog.int4send((s % 16)::int)), array_agg(pg_catalog.convert_to(repeat('r', 200), 'UTF8')))
                FROM generate_series(1001, 1064) o, generate_series(1::bigint, 2000) s"
        cluster_psql x "$shard0" postgres -q -c "CREATE DATABASE onenode"
        cluster_psql x "$shard0" onenode -q -c "CREATE EXTENSION pg_envelopes" -c "$load" >/dev/null
        cluster_psql x "$PROXY_PORT" envelopes -q -c "$load" >/dev/null
        echo "SELECT count(*) FROM envelopes.select_gateway_envelopes(originator_node_ids => (SELECT array_agg(o) FROM generate_series(1001, 1064) o), row_limit => 1000);" >"$OUT/router_read.sql"
        echo "SELECT count(*) FROM envelopes.select_gateway_envelopes('{1001,1002,1003,1004}', '{500,500,500,500}', originator_node_ids => '{1001,1002,1003,1004}', row_limit => 1000);" >"$OUT/router_read_some.sql"
        # The same reads returning their rows, as a reader gets them.
        echo "SELECT * FROM envelopes.select_gateway_envelopes(originator_node_ids => (SELECT array_agg(o) FROM generate_series(1001, 1064) o), row_limit => 1000);" >"$OUT/router_read_rows.sql"
        echo "SELECT * FROM envelopes.select_gateway_envelopes('{1001,1002,1003,1004}', '{500,500,500,500}', originator_node_ids => '{1001,1002,1003,1004}', row_limit => 1000);" >"$OUT/router_read_some_rows.sql"
        if selected router; then
            for run in $(seq "$RUNS"); do
                for kind in read read_some; do
                    router_cell "$kind" onenode "$shard0" onenode 1
                    router_cell "$kind" proxy "$PROXY_PORT" envelopes 1
                done
            done
        fi
        if selected routerpin; then
            # pin_cluster DIR CPU: the postmaster and every process it has
            # started so far (backends started later inherit the postmaster's).
            pin_cluster() {
                local pm pid
                pm=$(head -n 1 "$1/data/postmaster.pid")
                for pid in "$pm" $(pgrep -P "$pm"); do taskset -apc "$2" "$pid" >/dev/null; done
            }
            for i in $(seq 0 $((SHARD_COUNT - 1))); do pin_cluster "$shards_dir/shard$i" 1; done
            pin_cluster "$shards_dir/proxy" 0
            # cpu_busy N: busy jiffies of CPU N so far (all but idle and iowait).
            cpu_busy() { awk -v c="cpu$1" '$1 == c { print $2 + $3 + $4 + $7 + $8 }' /proc/stat; }
            # The writes of the pinned cells carry their ids from the client, as
            # a gateway's do: each of the 4 clients writes its own originator of
            # shard 0, in order, from a base of its own per cell (ids drawn with
            # nextval() would be drawn on the shard when direct and on the proxy
            # when routed).
            cells=0
            # pinned_cell KIND VARIANT PORT DB: 4 clients on CPU 0.
            pinned_cell() {
                local b0 b1 t0 out tps elapsed script=$OUT/router_$1.sql
                cells=$((cells + 1))
                b0=$(cpu_busy 0) b1=$(cpu_busy 1) t0=$(date +%s.%N)
                case $1 in
                insert|batch)
                    # The writes come from a gateway-shaped client (bulk_load:
                    # prepared, every value a binary bind parameter), the same
                    # one straight and through the proxy; literals in a pgbench
                    # script would be decoded once, at PREPARE, when straight.
                    local mode=single rows=1
                    [ "$1" = batch ] && mode=extension rows=100
                    out=$(ENVELOPES_LOAD_NODES=$(IFS=,; echo "${mine[*]:0:4}") \
                        ENVELOPES_LOAD_FIRST_SEQ=$((cells * 1000000000)) \
                        taskset -c 0 "$BULK" "host=127.0.0.1 port=$3 user=postgres dbname=$4" \
                        "$mode" 4 "$SECONDS_PER_RUN" "$rows" 2>"$OUT/pgbench.err")
                    tps=$(python3 -c "print($out / $rows)" 2>/dev/null || true) ;;
                *)
                    out=$(taskset -c 0 "$PG_BIN/pgbench" -n -M prepared -h 127.0.0.1 -p "$3" -U postgres \
                        -c 4 -j 1 -T "$SECONDS_PER_RUN" -D seq=$((cells * 1000000000)) \
                        -f "$script" "$4" 2>"$OUT/pgbench.err")
                    tps=$(awk '/^tps = / { print $3; exit }' <<<"$out") ;;
                esac
                elapsed=$(python3 -c "print($(date +%s.%N) - $t0)")
                [ -n "$tps" ] || { cat "$OUT/pgbench.err" >&2; exit 1; }
                read -r busy0 busy1 us0 us1 < <(python3 -c "
hz = $(getconf CLK_TCK); e = $elapsed
d0 = ($(cpu_busy 0) - $b0) / hz; d1 = ($(cpu_busy 1) - $b1) / hz
print(f'{100 * d0 / e:.0f} {100 * d1 / e:.0f} {1e6 * d0 / ($tps * e):.0f} {1e6 * d1 / ($tps * e):.0f}')")
                record "routerpin_$1" "$2" "$durability" "$run" "$tps" tps
                record "routerpin_$1_cpu0" "$2" "$durability" "$run" "$busy0" "% busy"
                record "routerpin_$1_cpu1" "$2" "$durability" "$run" "$busy1" "% busy"
                record "routerpin_$1_cpu0_us" "$2" "$durability" "$run" "$us0" "us/call"
                record "routerpin_$1_cpu1_us" "$2" "$durability" "$run" "$us1" "us/call"
                log "routerpin_$1 [$durability] $2 run $run: $tps tps (CPU 0 ${busy0}% busy, ${us0} us a call; CPU 1 ${busy1}% busy, ${us1} us a call)"
            }
            for run in $(seq "$RUNS"); do
                for kind in insert batch; do
                    pinned_cell "$kind" direct "$shard0" envelopes
                    pinned_cell "$kind" proxy "$PROXY_PORT" envelopes
                done
                for kind in read_rows read_some_rows; do
                    pinned_cell "$kind" onenode "$shard0" onenode
                    pinned_cell "$kind" proxy "$PROXY_PORT" envelopes
                done
            done
        fi
        scripts/shards.sh down "$shards_dir" 2>/dev/null
        shards_dir=""
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

    if selected shapes && [ "$durability" = off ]; then
        # xmtpd's read shapes, each function vs the same read in plain SQL over
        # the roots as xmtpd writes it (bench/sql/shape_*.sql), at 50 leaf
        # partitions (5 originators x 10 bands) and 5,000 (50 x 100; 1,000 with
        # --quick), 1 and 4 clients. Shapes: one originator from the start, a
        # poll at the end of one originator's data, per-topic cursors (4 topics
        # of every originator from mid-history, 100 per entry), a wave page over
        # the same entries, the newest envelope of 4 topics, every originator's
        # highest sequence id. JIT is off for both forms: compiling a plan over
        # 5,000 partitions takes longer than any of these reads.
        if $quick; then big_bands=20; else big_bands=100; fi
        big=$((50 * big_bands))
        sql postgres -q -c "CREATE DATABASE shapes50" -c "CREATE DATABASE shapesbig"
        sql shapes50 -q -v nodes=5 -v bands=10 -f bench/sql/read_setup.sql >/dev/null
        sql shapesbig -q -v nodes=50 -v bands=$big_bands -f bench/sql/read_setup.sql >/dev/null
        for db in shapes50 shapesbig; do sql "$db" -q -f bench/sql/shapes_setup.sql; done
        for run in $(seq "$RUNS"); do
            for shape in originator poll topics wave newest maxima; do
                for pair in shapes50:50 shapesbig:$big; do
                    IFS=: read -r db parts <<<"$pair"
                    for clients in 1 4; do
                        forms=(fn sql)
                        # The two originator-keyed shapes also run with literals (sqllit).
                        [[ $shape = originator || $shape = poll ]] && forms+=(sqllit)
                        for form in "${forms[@]}"; do
                            if [ "$db:$form" = shapesbig:sql ] && [[ $shape = topics || $shape = wave ]]; then
                                # Plain SQL over every partition: one call takes
                                # minutes, so each client makes one call per
                                # round, cut at 120 s, and the rate recorded is
                                # clients / time taken: exact when the calls
                                # finish, more than the real rate when they are
                                # cut (the ratio is then a lower bound).
                                started=$(date +%s.%N)
                                pids=()
                                for _ in $(seq "$clients"); do
                                    PGOPTIONS="-c jit=off -c statement_timeout=120s" sql "$db" -q \
                                        -f "bench/sql/shape_${shape}_$form.sql" >/dev/null 2>&1 &
                                    pids+=($!)
                                done
                                for pid in "${pids[@]}"; do wait "$pid" || true; done
                                tps=$(python3 -c "print($clients / ($(date +%s.%N) - $started))")
                            else
                                # Plain forms plan every call with the values
                                # bound (force_custom_plan): what a long-lived
                                # connection settles on anyway, without the
                                # one-time generic plan over every partition
                                # (1 s at 1,000 partitions, a minute at 5,000)
                                # that a short cell would mostly measure.
                                options="-c jit=off"
                                [ "$form" = fn ] || options+=" -c plan_cache_mode=force_custom_plan"
                                tps=$(PGOPTIONS="$options" pgbench_tps "$db" "$clients" "bench/sql/shape_${shape}_$form.sql")
                            fi
                            [ -n "$tps" ] || { cat "$OUT/pgbench.err" >&2; exit 1; }
                            record "shapes_${shape}_${parts}_c$clients" "$form" "$durability" "$run" "$tps" reads/s
                            log "shapes [$durability] ${shape} ${parts} parts ${clients} clients $form run $run: $tps reads/s"
                        done
                    done
                done
            done
        done
    fi

    if selected xmtpd && [ "$durability" = off ]; then
        # xmtpd's read shapes on the data set of its comparison: 20 originators x
        # 50,000 envelopes of 200 bytes on 200 topics (bench/sql/xmtpd_setup.sql),
        # in bands of 1,000,000 ids (20 leaf partitions a table) and of 10,000
        # (100). Each shape (bench/sql/xmtpd_SHAPE_FORM.sql) through the
        # extension's function (fn), through the xmtpd layer (layer) and as a
        # query in the shape of xmtpd's own over the tables, its values bound as
        # xmtpd's driver binds them, planned generic (xmtpd_generic) and custom
        # (xmtpd_custom); xmtpd is the better of the two in each run. One
        # originator from the start also runs as the hand-written join with the
        # values written in (plain: pruned once, at PREPARE). Array arguments
        # are pgbench -D variables, bound as text. 1 and 4 clients; JIT off.
        # shellcheck disable=SC1090
        source <(python3 - <<'PY'
nodes = list(range(1, 21))
topic = lambda t: "\\\\x%08x" % t
arr = lambda xs: "{" + ",".join(str(x) for x in xs) + "}"
entries = [(topic(t), n) for n in nodes for t in range(4)]
print("xvars=(-D nodes='%s' -D seqs='%s' -D ceilings='%s' -D topics='%s' -D ctopics='%s' -D cnodes='%s' -D cseqs='%s')" % (
    arr(nodes), arr([25000] * 20), arr([50000] * 20), arr(topic(t) for t in range(4)),
    arr(e[0] for e in entries), arr(e[1] for e in entries), arr([25000] * len(entries))))
PY
)
        for width in 1000000 10000; do
            sql postgres -q -c "CREATE DATABASE xmtpd$width"
            sql "xmtpd$width" -q -v width=$width -f bench/sql/xmtpd_setup.sql >/dev/null
        done
        for run in $(seq "$RUNS"); do
            for shape in originator originators topics unfiltered pertopic wave newest ceilings; do
                for width in 1000000 10000; do
                    for clients in 1 4; do
                        forms=(fn layer xmtpd_generic xmtpd_custom)
                        [ "$shape" = originator ] && forms+=(plain)
                        best=0
                        for form in "${forms[@]}"; do
                            options="-c jit=off"
                            script=$form
                            case $form in
                            xmtpd_generic) options+=" -c plan_cache_mode=force_generic_plan" script=xmtpd ;;
                            xmtpd_custom) options+=" -c plan_cache_mode=force_custom_plan" script=xmtpd ;;
                            esac
                            tps=$(PGOPTIONS="$options" "$PG_BIN/pgbench" -n -M prepared -h 127.0.0.1 -p "$PORT" -U postgres \
                                -c "$clients" -j "$clients" -T "$SECONDS_PER_RUN" "${xvars[@]}" \
                                -f "bench/sql/xmtpd_${shape}_$script.sql" "xmtpd$width" 2>"$OUT/pgbench.err" \
                                | awk '/^tps = / { print $3; exit }')
                            [ -n "$tps" ] || { cat "$OUT/pgbench.err" >&2; exit 1; }
                            record "xmtpd_${shape}_${width}_c$clients" "$form" "$durability" "$run" "$tps" reads/s
                            log "xmtpd [$durability] $shape width $width $clients clients $form run $run: $tps reads/s"
                            if [[ $form = xmtpd_* ]]; then
                                best=$(python3 -c "print(max($best, $tps))")
                            fi
                        done
                        record "xmtpd_${shape}_${width}_c$clients" xmtpd "$durability" "$run" "$best" reads/s
                    done
                done
            done
        done
    fi

    if selected view && [ "$durability" = off ]; then
        # xmtpd-shaped reads through gateway_envelopes_view (each meta row's blob
        # looked up by key) against the join of meta and blob it was before 0.4.0
        # (bench/sql/view_setup.sql), in the same database: 20 originators
        # x 50 bands of 100 ids. Shapes: sync (one originator after a cursor in
        # the middle), point (one key), topic (newest 50 of a topic, every
        # originator), scan (every envelope of the store).
        sql postgres -q -c "CREATE DATABASE viewdb"
        sql viewdb -q -v nodes=20 -v bands=50 -f bench/sql/read_setup.sql >/dev/null
        sql viewdb -q -f bench/sql/view_setup.sql
        for shape in sync point topic scan; do
            for view in lookup join; do
                name=envelopes.gateway_envelopes_view
                [ "$view" = join ] && name=bench_join_view
                sed "s/@VIEW@/$name/" "bench/sql/view_$shape.sql" >"$OUT/view_${shape}_$view.sql"
            done
        done
        for run in $(seq "$RUNS"); do
            for shape in sync point topic scan; do
                for view in lookup join; do
                    tps=$(pgbench_tps viewdb 1 "$OUT/view_${shape}_$view.sql")
                    [ -n "$tps" ] || { cat "$OUT/pgbench.err" >&2; exit 1; }
                    record view "${shape}_$view" "$durability" "$run" "$tps" reads/s
                    log "view [$durability] ${shape}_$view run $run: $tps reads/s"
                done
            done
        done
    fi

    if selected feedcost; then
        # In-order single-row and 100-row inserts, 2 clients each on its own
        # originator: this version against the baseline build, interleaved.
        start_baseline
        for port in "$PORT" "$BASE_PORT"; do
            cluster_psql bench "$port" postgres -q -c "CREATE DATABASE feed"
            cluster_psql bench "$port" feed -q -f bench/sql/feed_setup.sql >/dev/null
        done
        # The difference sought (a few percent) is smaller than this machine's
        # run-to-run noise over 15 s (about 10%): many short cells instead, the
        # order of the two versions swapped every other run, medians compared.
        feed_runs=$((RUNS * 3)) feed_seconds=5
        $quick && feed_runs=$RUNS feed_seconds=$SECONDS_PER_RUN
        for run in $(seq "$feed_runs"); do
            order="current baseline"; [ $((run % 2)) -eq 0 ] && order="baseline current"
            for kind in insert batch; do
                for variant in $order; do
                    port=$PORT; [ "$variant" = baseline ] && port=$BASE_PORT
                    cluster_psql bench "$port" feed -q -f bench/sql/feed_reset.sql >/dev/null
                    tps=$(SECONDS_PER_RUN=$feed_seconds pgbench_tps_on "$port" feed 2 "bench/sql/feed_$kind.sql")
                    [ -n "$tps" ] || { cat "$OUT/pgbench.err" >&2; exit 1; }
                    record feedcost "${kind}_$variant" "$durability" "$run" "$tps" tps
                    log "feedcost [$durability] ${kind}_$variant run $run: $tps tps"
                done
            done
        done
        for port in "$PORT" "$BASE_PORT"; do
            cluster_psql bench "$port" postgres -q -c "DROP DATABASE feed WITH (FORCE)"
        done
    fi

    if selected latebridge && [ "$durability" = off ]; then
        # Bridge to JetStream draining a backlog in order, and the same backlog with
        # every tenth envelope inserted after the rest (a late arrival each), and
        # with every other one (half of them late).
        if $quick; then backlog=20000; else backlog=200000; fi
        for run in $(seq "$RUNS"); do
            for variant in inorder late late50; do
                db="late_${run}_$variant"
                stream="BENCHL$$_${run}_$variant" prefix="benchl$$r${run}$variant"
                sql postgres -q -c "CREATE DATABASE $db"
                sql "$db" -q -c "CREATE EXTENSION pg_envelopes"
                load() {
                    sql "$db" -q -c "SET envelopes.notify = off" -c "SELECT envelopes.insert_gateway_envelopes(
                        array_agg((1 + s % 4)::int), array_agg(s), array_agg(pg_catalog.int4send(s::int % 16)),
                        array_agg(pg_catalog.convert_to(repeat('e', 200), 'UTF8')))
                      FROM generate_series(1::bigint, $backlog) s WHERE $1" >/dev/null
                }
                case $variant in
                    inorder) load true ;;
                    late) load "s % 10 <> 0"; load "s % 10 = 0" ;;
                    # every other row of each originator (s % 4 is the originator)
                    late50) load "(s / 4) % 2 <> 0"; load "(s / 4) % 2 = 0" ;;
                esac
                sql "$db" -q -c "SELECT envelopes.consumer_register('bench')"
                drain_backlog "$db" "$stream" "$prefix" "$backlog"
                late=$(sql "$db" -At -c "SELECT count(*) FROM envelopes.gateway_envelopes_meta WHERE late")
                record latebridge "$variant" "$durability" "$run" "$rate" envelopes/s
                log "latebridge [$durability] $variant run $run: $backlog envelopes ($late late) in ${elapsed}s = $rate/s"
                kill -TERM "$bridge"; wait "$bridge" || true
                "$PROBE" "$NATS_URL" --delete "$stream"
                stream=""
                sql postgres -q -c "DROP DATABASE $db WITH (FORCE)"
            done
        done
    fi

    if selected idle && [ "$durability" = off ]; then
        # An idle consumer's poll (consumer_envelope_batch with nothing to read) at
        # 10, 1,000 and 10,000 originators, on this version and the baseline, and
        # the CPU an idle bridge (polling every 200 ms) and its backend use.
        start_baseline
        if $quick; then sizes="10 1000"; else sizes="10 1000 10000"; fi
        for n in $sizes; do
            for variant in current baseline; do
                port=$PORT; [ "$variant" = baseline ] && port=$BASE_PORT
                db="idle_$n"
                cluster_psql bench "$port" postgres -q -c "CREATE DATABASE $db"
                cluster_psql bench "$port" "$db" -q -c "CREATE EXTENSION pg_envelopes"
                for first in $(seq 1 100 "$n"); do
                    # 100 new originators a call: envelopes.max_new_partitions_per_call
                    last=$((first + 99 < n ? first + 99 : n))
                    cluster_psql bench "$port" "$db" -q -c "SET envelopes.create_partitions_in = transaction" \
                        -c "SET envelopes.notify = off" -c "SELECT envelopes.insert_gateway_envelopes(
                            array_agg(g::int), array_agg(1::bigint), array_agg('\x01'::bytea), array_agg('\x02'::bytea))
                          FROM generate_series($first, $last) g" >/dev/null
                done
                cluster_psql bench "$port" "$db" -q -c "SELECT envelopes.consumer_register('idle', false)"
            done
            for run in $(seq "$RUNS"); do
                for variant in current baseline; do
                    port=$PORT; [ "$variant" = baseline ] && port=$BASE_PORT
                    tps=$(pgbench_tps_on "$port" "idle_$n" 1 bench/sql/idle_poll.sql)
                    [ -n "$tps" ] || { cat "$OUT/pgbench.err" >&2; exit 1; }
                    ms=$(python3 -c "print(f'{1000 / $tps:.4f}')")
                    record idle "poll_${variant}_$n" "$durability" "$run" "$ms" ms
                    log "idle [$durability] poll $variant at $n originators run $run: $ms ms"
                done
                # The idle bridge of this version: its CPU and its backend's, per core.
                url="postgres://postgres@127.0.0.1:$PORT/idle_$n"
                "$BRIDGE" egress --database-url "$url" --name idle --register --sink jsonl:/dev/null 2>"$OUT/bridge.log" &
                bridge=$!
                sleep 3
                backend=$(sql "idle_$n" -At -c "SELECT pid FROM pg_stat_activity WHERE application_name = 'envelopes-bridge egress' LIMIT 1")
                b0=$(cpu_ticks "$bridge") s0=$(cpu_ticks "$backend")
                sleep "$SECONDS_PER_RUN"
                b1=$(cpu_ticks "$bridge") s1=$(cpu_ticks "$backend")
                hz=$(getconf CLK_TCK)
                for pair in "bridge:$b0:$b1" "backend:$s0:$s1"; do
                    IFS=: read -r who t0 t1 <<<"$pair"
                    pct=$(python3 -c "print(f'{100 * ($t1 - $t0) / $hz / $SECONDS_PER_RUN:.3f}')")
                    record idle "cpu_${who}_$n" "$durability" "$run" "$pct" "% of a core"
                    log "idle [$durability] $who CPU at $n originators run $run: $pct% of a core"
                done
                kill -TERM "$bridge"; wait "$bridge" || true
            done
            for port in "$PORT" "$BASE_PORT"; do
                cluster_psql bench "$port" postgres -q -c "DROP DATABASE idle_$n WITH (FORCE)"
            done
        done
    fi

    if selected lagquery && [ "$durability" = off ]; then
        # The bridge's per-round lag query (consumer_lag after every round that
        # moved rows): (1) drain rate of a 200,000-row backlog over 100
        # originators into jsonl:/dev/null with it on (the default) and off
        # (--lag-every-round false: every 5 s), interleaved, a fresh consumer per
        # run; (2) the query's own cost at 10 and 10,000 originators.
        if $quick; then per=200; else per=2000; fi
        sql postgres -q -c "CREATE DATABASE lagq"
        sql lagq -q -c "CREATE EXTENSION pg_envelopes"
        sql lagq -q -c "SET envelopes.notify = off" -c "SELECT envelopes.insert_gateway_envelopes(
                array_agg((1 + s % 100)::int), array_agg(1 + s / 100), array_agg('\x01'::bytea),
                array_agg(pg_catalog.convert_to(repeat('e', 100), 'UTF8')))
              FROM generate_series(0::bigint, 100 * $per - 1) s" >/dev/null
        for run in $(seq "$RUNS"); do
            for variant in on off; do
                name="lq_${variant}_$run"
                sql lagq -q -c "SELECT envelopes.consumer_register('$name')"
                flag=true; [ "$variant" = off ] && flag=false
                started=$(date +%s.%N)
                "$BRIDGE" egress --database-url "postgres://postgres@127.0.0.1:$PORT/lagq" --name "$name" \
                    --sink jsonl:/dev/null --batch-size 1000 --lag-every-round "$flag" 2>"$OUT/bridge.log" &
                bridge=$!
                until [ "$(sql lagq -At -c "SELECT envelopes_pending FROM envelopes.consumer_status WHERE consumer = '$name'")" = 0 ]; do
                    sleep 0.05
                done
                rate=$(python3 -c "print(f'{100 * $per / ($(date +%s.%N) - $started):.0f}')")
                kill -TERM "$bridge"; wait "$bridge" || true
                bridge=""
                record lagquery_drain "$variant" "$durability" "$run" "$rate" envelopes/s
                log "lagquery [$durability] lag query $variant run $run: drained $((100 * per)) envelopes at $rate/s"
            done
        done
        sql postgres -q -c "DROP DATABASE lagq WITH (FORCE)"
        for n in 10 10000; do
            db="lagcost_$n"
            sql postgres -q -c "CREATE DATABASE $db"
            sql "$db" -q -c "CREATE EXTENSION pg_envelopes"
            for first in $(seq 1 100 "$n"); do
                # 100 new originators a call: envelopes.max_new_partitions_per_call
                last=$((first + 99 < n ? first + 99 : n))
                sql "$db" -q -c "SET envelopes.create_partitions_in = transaction" -c "SET envelopes.notify = off" \
                    -c "SELECT envelopes.insert_gateway_envelopes(array_agg(g::int), array_agg(1::bigint),
                          array_agg('\x01'::bytea), array_agg('\x02'::bytea)) FROM generate_series($first, $last) g" >/dev/null
            done
            sql "$db" -q -c "SELECT envelopes.consumer_register('lq')"
            for run in $(seq "$RUNS"); do
                tps=$(pgbench_tps "$db" 1 bench/sql/consumer_lag.sql)
                [ -n "$tps" ] || { cat "$OUT/pgbench.err" >&2; exit 1; }
                ms=$(python3 -c "print(f'{1000 / $tps:.4f}')")
                record lagquery_cost_ms "originators_$n" "$durability" "$run" "$ms" ms
                log "lagquery [$durability] consumer_lag at $n originators run $run: $ms ms"
            done
            sql postgres -q -c "DROP DATABASE $db WITH (FORCE)"
        done
    fi

    if selected horizon && [ "$durability" = off ]; then
        # Commit -> JetStream latency of envelopes and outbox rows at 1,000
        # transactions a second (each with one of each), undisturbed, and with a
        # transaction in another database that created a table and stays open for
        # the whole run (it holds the cluster's xmin horizon back).
        if $quick; then run_seconds=5; else run_seconds=60; fi
        sql postgres -q -c "CREATE DATABASE horizon" -c "CREATE DATABASE unrelated"
        sql horizon -q -c "CREATE EXTENSION pg_envelopes" -c "CREATE SEQUENCE bench_seq" \
            -c "SELECT envelopes.consumer_register('h')"
        stream="BENCHH$$" prefix="benchh$$"
        url="postgres://postgres@127.0.0.1:$PORT/horizon"
        "$BRIDGE" egress --database-url "$url" --name h --register --sink "$NATS_URL" \
            --nats-stream "$stream" --subject-prefix "$prefix" 2>"$OUT/bridge.log" &
        bridge=$!
        for run in $(seq "$RUNS"); do
            for variant in clear blocked; do
                holder=""
                if [ "$variant" = blocked ]; then
                    sql unrelated -q -c "BEGIN" -c "CREATE TABLE IF NOT EXISTS held (x int)" \
                        -c "INSERT INTO held VALUES (1)" -c "SELECT pg_sleep($run_seconds + 30)" >/dev/null 2>&1 &
                    holder=$!
                    sleep 1
                fi
                n=$((run_seconds * 1000))
                "$PROBE" "$NATS_URL" "$prefix" $((2 * n)) --with-outbox >"$OUT/probe.out" &
                probe=$!
                until grep -q ready "$OUT/probe.out" 2>/dev/null; do sleep 0.1; done
                "$PG_BIN/pgbench" -n -M prepared -h 127.0.0.1 -p "$PORT" -U postgres -c 4 -j 2 -R 1000 \
                    -t $((n / 4)) -f bench/sql/horizon_rate.sql horizon >/dev/null 2>"$OUT/pgbench.err"
                wait "$probe"
                { read -r ep50 ep99 emax ecount; read -r op50 op99 omax ocount; } < <(tail -n 2 "$OUT/probe.out")
                for kind in envelope outbox; do
                    if [ $kind = envelope ]; then p50=$ep50 p99=$ep99 count=$ecount; else p50=$op50 p99=$op99 count=$ocount; fi
                    record horizon "p99_${kind}_$variant" "$durability" "$run" "$p99" ms
                    record horizon "p50_${kind}_$variant" "$durability" "$run" "$p50" ms
                    log "horizon [$durability] $variant $kind run $run: p50 ${p50}ms p99 ${p99}ms ($count messages)"
                done
                if [ -n "$holder" ]; then
                    sql postgres -q -c "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = 'unrelated'" >/dev/null
                    wait "$holder" 2>/dev/null || true
                fi
            done
        done
        kill -TERM "$bridge"; wait "$bridge" || true
        "$PROBE" "$NATS_URL" --delete "$stream"
        stream=""
        sql postgres -q -c "DROP DATABASE horizon WITH (FORCE)" -c "DROP DATABASE unrelated WITH (FORCE)"
    fi

    if selected decoding && [ "$durability" = off ]; then
        # The table feed against logical decoding (test_decoding), on a second
        # cluster with wal_level = logical and otherwise the same settings.
        if $quick; then n=20000; else n=200000; fi
        LPORT=$(free_port)
        cluster_start logical "$LPORT" "${TUNING[@]}" "synchronous_commit = off" \
            "wal_level = logical" "max_replication_slots = 8"
        lsql() { cluster_psql logical "$LPORT" "$@"; }
        lsql postgres -q -c "CREATE DATABASE dec" -c "CREATE DATABASE busy" -c "CREATE DATABASE decins"
        lsql dec -q -c "CREATE EXTENSION pg_envelopes" \
            -c "SELECT envelopes.ensure_gateway_parts(n, 1, 100000000) FROM generate_series(1, 4) n" >/dev/null
        lsql busy -q -c "CREATE TABLE junk (x text)"
        lsql dec -q -c "SELECT pg_create_logical_replication_slot('dec', 'test_decoding')" >/dev/null
        sql postgres -q -c "CREATE DATABASE decins"
        for port in "$PORT" "$LPORT"; do cluster_psql bench "$port" decins -q -f bench/sql/feed_setup.sql >/dev/null; done
        lsql decins -q -c "SELECT pg_create_logical_replication_slot('ins', 'test_decoding')" >/dev/null
        for run in $(seq "$RUNS"); do
            # Inserts: the same in-order load on wal_level = replica and = logical
            # (a slot exists there and is drained after each cell).
            for variant in replica logical; do
                port=$PORT; [ "$variant" = logical ] && port=$LPORT
                cluster_psql bench "$port" decins -q -f bench/sql/feed_reset.sql >/dev/null
                tps=$(pgbench_tps_on "$port" decins 2 bench/sql/feed_insert.sql)
                [ -n "$tps" ] || { cat "$OUT/pgbench.err" >&2; exit 1; }
                record decoding "insert_$variant" "$durability" "$run" "$tps" tps
                log "decoding [$durability] insert on wal_level=$variant run $run: $tps tps"
            done
            lsql decins -q -c "SELECT count(*) FROM pg_logical_slot_get_changes('ins', NULL, NULL)" >/dev/null

            # Drain: n envelopes in 100-row transactions, read once by a consumer
            # (batches of 1,000 with acks) and once through the slot.
            first=$(( (run - 1) * n + 1 ))
            lsql dec -q -c "SELECT envelopes.consumer_register('feed$run', false)" >/dev/null
            lsql dec -q -At -c "SELECT format('SELECT envelopes.insert_gateway_envelopes(array_agg((1 + s %% 4)::int), array_agg(s),
                                   array_agg(''\x01''::bytea), array_agg(pg_catalog.convert_to(repeat(''e'', 200), ''UTF8'')))
                                   FROM generate_series(%s::bigint, %s) s;', b, b + 99)
                                 FROM generate_series($first, $first + $n - 1, 100) b" \
                | lsql dec -q >/dev/null
            printf "SELECT envelopes.consumer_envelope_ack('feed$run', COALESCE(array_agg(originator_node_id), '{}'), COALESCE(array_agg(originator_sequence_id), '{}'), max(late_id)) FROM envelopes.consumer_envelope_batch('feed$run', 1000);\n" >"$OUT/drain.sql"
            started=$(date +%s.%N)
            "$PG_BIN/pgbench" -n -h 127.0.0.1 -p "$LPORT" -U postgres -c 1 -t $((n / 1000 + 1)) -f "$OUT/drain.sql" dec >/dev/null 2>"$OUT/pgbench.err" \
                || { cat "$OUT/pgbench.err" >&2; exit 1; }
            rate=$(python3 -c "print(f'{$n / ($(date +%s.%N) - $started):.0f}')")
            left=$(lsql dec -At -c "SELECT envelopes_pending FROM envelopes.consumer_status WHERE consumer = 'feed$run'")
            record decoding drain_feed "$durability" "$run" "$rate" envelopes/s
            log "decoding [$durability] table feed drained $n envelopes at $rate/s ($left left)"
            # Decoding reads only flushed WAL: one durable commit flushes all of it.
            lsql dec -q -c "SET synchronous_commit = on" -c "SELECT pg_current_xact_id()" >/dev/null
            started=$(date +%s.%N)
            changes=$(lsql dec -At -c "SELECT count(*) FROM pg_logical_slot_get_changes('dec', NULL, NULL)")
            rate=$(python3 -c "print(f'{$n / ($(date +%s.%N) - $started):.0f}')")
            record decoding drain_decoding "$durability" "$run" "$rate" envelopes/s
            log "decoding [$durability] logical decoding read $changes changes for $n envelopes at $rate/s"

            # An idle read after another database wrote about 100 MB of WAL.
            lsql busy -q -c "INSERT INTO junk SELECT repeat('x', 1000) FROM generate_series(1, 100000)"
            lsql dec -q -c "SELECT count(*) FROM envelopes.consumer_envelope_batch('feed$run', 1000)" >/dev/null
            for variant in feed decoding; do
                if [ $variant = feed ]; then
                    q="SELECT count(*) FROM envelopes.consumer_envelope_batch('feed$run', 1000)"
                else
                    q="SELECT count(*) FROM pg_logical_slot_get_changes('dec', NULL, NULL)"
                fi
                ms=$(printf '\\timing on\n%s;\n' "$q" | lsql dec -At | awk '/^Time:/ { print $2 }')
                record decoding "idle_after_100MB_$variant" "$durability" "$run" "$ms" ms
                log "decoding [$durability] idle read after 100 MB of unrelated WAL, $variant: ${ms} ms"
            done
            lsql busy -q -c "TRUNCATE junk"

            # Registering a consumer / creating a slot while a transaction with an id
            # runs for 5 s in another database.
            lsql busy -q -c "BEGIN" -c "INSERT INTO junk VALUES ('y')" -c "SELECT pg_sleep(5)" -c "COMMIT" >/dev/null &
            holder=$!
            sleep 0.5
            for variant in feed decoding; do
                if [ $variant = feed ]; then
                    q="SELECT envelopes.consumer_register('new$run', false)"
                else
                    q="SELECT pg_create_logical_replication_slot('new$run', 'test_decoding')"
                fi
                ms=$(printf '\\timing on\n%s;\n' "$q" | lsql dec -At | awk '/^Time:/ { print $2 }')
                record decoding "register_$variant" "$durability" "$run" "$ms" ms
                log "decoding [$durability] register ($variant) with a transaction open elsewhere: ${ms} ms"
            done
            wait "$holder" || true
            lsql dec -q -c "SELECT pg_drop_replication_slot('new$run')" >/dev/null
        done
        lsql dec -q -c "SELECT pg_drop_replication_slot('dec')" >/dev/null
        lsql decins -q -c "SELECT pg_drop_replication_slot('ins')" >/dev/null
        sql postgres -q -c "DROP DATABASE decins WITH (FORCE)"
        cluster_stop logical
        rm -rf "${ENVELOPES_TMP:?}/logical"
    fi

    cleanup
    BASE_PORT=""
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
if [ -n "$only" ]; then
    # A partial run updates its own section of RESULTS.md, leaving the full run's;
    # on another major than 15, a section of its own for that major.
    section=$only
    [ "$(pg_major)" = 15 ] || section="$only on PostgreSQL $(pg_major)"
    "$REPORT_PYTHON" bench/report.py "$OUT" bench/RESULTS.md --section "$section"
else
    "$REPORT_PYTHON" bench/report.py "$OUT" bench/RESULTS.md
fi
log "wrote bench/RESULTS.md"
