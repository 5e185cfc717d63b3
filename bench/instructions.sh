#!/usr/bin/env bash
# Instructions per inserted row, counted by valgrind (callgrind) in a single-user
# backend: repeatable to a fraction of a percent, unlike timings on two shared
# cores (this machine's perf has no instruction counter).
#
# usage: bench/instructions.sh [OUT.tsv]
#
# Each variant runs twice in a fresh single-user backend, with N1 and N2 rows;
# (instructions(N2) - instructions(N1)) / (rows(N2) - rows(N1)) is what one more
# row costs, start-up and the one-time work (plan caches, relation caches)
# cancelled out. Every statement commits on its own, as pgbench's do, and the
# plain variants are PREPAREd, as pgbench -M prepared runs them. Rows go into
# partitions created beforehand. Expects the extension installed
# (bench/run.sh runs this after installing the release build).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

out=${1:-bench/out/instructions.tsv}
mkdir -p "$(dirname "$out")"
: >"$out"
name=icount
dir="$ENVELOPES_TMP/$name"
port=$(free_port)
cluster_start "$name" "$port" "synchronous_commit = off" "autovacuum = off" "shared_buffers = 256MB"
trap 'cluster_stop "$name"; rm -rf "${ENVELOPES_TMP:?}/$name"' EXIT
cluster_psql "$name" "$port" postgres -q -c "CREATE DATABASE icount"
cluster_psql "$name" "$port" icount -q >/dev/null <<'SQL'
CREATE EXTENSION pg_envelopes;
SELECT envelopes.ensure_gateway_parts(n, 1, 10000000) FROM generate_series(1, 4) n;
SQL
cluster_stop "$name"

TOPIC="'\\x0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef'::bytea"
ENVELOPE="pg_catalog.decode(repeat('a5', 272), 'hex')"

# statements VARIANT N: N rows' worth of statements for a single-user backend (one
# statement per line), preceded by the PREPARE.
statements() {
    local variant=$1 n=$2 i
    case $variant in
    extension)
        echo "PREPARE s(int, bigint) AS SELECT envelopes.insert_gateway_envelope(\$1, \$2, $TOPIC, $ENVELOPE);"
        for ((i = 1; i <= n; i++)); do echo "EXECUTE s($((i % 4 + 1)), $i);"; done ;;
    plain|plain_idempotent)
        local conflict=""
        [ "$variant" = plain_idempotent ] && conflict="ON CONFLICT DO NOTHING"
        echo "PREPARE s(int, bigint) AS WITH m AS (INSERT INTO envelopes.gateway_envelopes_meta (originator_node_id, originator_sequence_id, topic) VALUES (\$1, \$2, $TOPIC) $conflict RETURNING originator_node_id, originator_sequence_id) INSERT INTO envelopes.gateway_envelopes_blob (originator_node_id, originator_sequence_id, originator_envelope) SELECT originator_node_id, originator_sequence_id, $ENVELOPE FROM m $conflict;"
        for ((i = 1; i <= n; i++)); do echo "EXECUTE s($((i % 4 + 1)), $i);"; done ;;
    batch_extension|bulk_extension)
        local size=100; [ "$variant" = bulk_extension ] && size=10000
        echo "PREPARE s(int, bigint) AS SELECT envelopes.insert_gateway_envelopes(array_agg(\$1), array_agg(g::bigint), array_agg($TOPIC), array_agg($ENVELOPE)) FROM pg_catalog.generate_series(\$2, \$2 + $size - 1) g;"
        for ((i = 0; i < n / size; i++)); do echo "EXECUTE s($((i % 4 + 1)), $((i * size + 1)));"; done ;;
    batch_plain|batch_plain_idempotent|bulk_plain_idempotent)
        local size=100 conflict="ON CONFLICT DO NOTHING"
        [ "$variant" = bulk_plain_idempotent ] && size=10000
        [ "$variant" = batch_plain ] && conflict=""
        echo "PREPARE s(int, bigint) AS WITH m AS (INSERT INTO envelopes.gateway_envelopes_meta (originator_node_id, originator_sequence_id, topic) SELECT \$1, g, $TOPIC FROM pg_catalog.generate_series(\$2, \$2 + $size - 1) g $conflict RETURNING originator_node_id, originator_sequence_id) INSERT INTO envelopes.gateway_envelopes_blob (originator_node_id, originator_sequence_id, originator_envelope) SELECT originator_node_id, originator_sequence_id, $ENVELOPE FROM m $conflict;"
        for ((i = 0; i < n / size; i++)); do echo "EXECUTE s($((i % 4 + 1)), $((i * size + 1)));"; done ;;
    late_extension|late_plain_idempotent)
        # Descending ids per originator: each row lands below one committed
        # before it, a late arrival (the plain form records nothing about it).
        local stmt
        if [ "$variant" = late_extension ]; then
            stmt="SELECT envelopes.insert_gateway_envelope(\$1, \$2, $TOPIC, $ENVELOPE);"
        else
            stmt="WITH m AS (INSERT INTO envelopes.gateway_envelopes_meta (originator_node_id, originator_sequence_id, topic) VALUES (\$1, \$2, $TOPIC) ON CONFLICT DO NOTHING RETURNING originator_node_id, originator_sequence_id) INSERT INTO envelopes.gateway_envelopes_blob (originator_node_id, originator_sequence_id, originator_envelope) SELECT originator_node_id, originator_sequence_id, $ENVELOPE FROM m ON CONFLICT DO NOTHING;"
        fi
        echo "PREPARE s(int, bigint) AS $stmt"
        for ((i = 1; i <= n; i++)); do echo "EXECUTE s($((i % 4 + 1)), $((1000000 - i)));"; done ;;
    late_batch_extension|late_batch_plain_idempotent)
        # A parallel backfill of originator 1 taken in turns: four ascending
        # ranges of 100-row batches, the k-th batch of each range after the k-th
        # of the others, so three batches in four land below committed rows.
        local stmt
        if [ "$variant" = late_batch_extension ]; then
            stmt="SELECT envelopes.insert_gateway_envelopes(array_agg(1), array_agg(g::bigint), array_agg($TOPIC), array_agg($ENVELOPE)) FROM pg_catalog.generate_series(\$2, \$2 + 99) g;"
        else
            stmt="WITH m AS (INSERT INTO envelopes.gateway_envelopes_meta (originator_node_id, originator_sequence_id, topic) SELECT \$1, g, $TOPIC FROM pg_catalog.generate_series(\$2, \$2 + 99) g ON CONFLICT DO NOTHING RETURNING originator_node_id, originator_sequence_id) INSERT INTO envelopes.gateway_envelopes_blob (originator_node_id, originator_sequence_id, originator_envelope) SELECT originator_node_id, originator_sequence_id, $ENVELOPE FROM m ON CONFLICT DO NOTHING;"
        fi
        echo "PREPARE s(int, bigint) AS $stmt"
        for ((i = 0; i < n / 100; i++)); do echo "EXECUTE s(1, $(( (i % 4) * 1000000 + (i / 4) * 100 + 1 )));"; done ;;
    bulk_copy)
        # COPY of meta then blob from server-side files of 10,000 rows each.
        local size=10000
        for ((i = 0; i < n / size; i++)); do
            local f="$dir/copy_$i"
            if [ ! -f "$f.meta" ]; then
                awk -v node=$((i % 4 + 1)) -v first=$((i * size + 1)) -v size=$size -v env="$(printf 'a5%.0s' $(seq 272))" -v fm="$f.meta" -v fb="$f.blob" 'BEGIN {
                    for (s = first; s < first + size; s++) {
                        printf "%d\t%d\t\\\\x0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\n", node, s > fm
                        printf "%d\t%d\t\\\\x%s\n", node, s, env > fb
                    } }'
                chown postgres "$f.meta" "$f.blob"
            fi
            echo "BEGIN;"
            echo "COPY envelopes.gateway_envelopes_meta (originator_node_id, originator_sequence_id, topic) FROM '$f.meta';"
            echo "COPY envelopes.gateway_envelopes_blob (originator_node_id, originator_sequence_id, originator_envelope) FROM '$f.blob';"
            echo "COMMIT;"
        done ;;
    esac
}

# instructions VARIANT N: total instructions of a single-user backend running the
# variant's statements for N rows on emptied tables.
instructions() {
    local variant=$1 n=$2 script="$dir/script.sql"
    {
        echo "TRUNCATE envelopes.gateway_envelopes_meta, envelopes.gateway_envelopes_blob, envelopes.late_envelopes;"
        statements "$variant" "$n"
    } >"$script"
    chown postgres "$script"
    as_postgres valgrind --tool=callgrind --callgrind-out-file=/dev/null \
        "$PG_BIN/postgres" --single -D "$dir/data" -c synchronous_commit=off icount \
        <"$script" 2>"$dir/valgrind.log" >"$dir/single.log"
    if grep -q "ERROR" "$dir/single.log"; then
        grep -m3 "ERROR" "$dir/single.log" >&2
        return 1
    fi
    awk '/Collected :/ { print $4 }' "$dir/valgrind.log"
}

for variant in extension plain plain_idempotent batch_extension batch_plain batch_plain_idempotent \
    bulk_extension bulk_plain_idempotent bulk_copy late_extension late_plain_idempotent \
    late_batch_extension late_batch_plain_idempotent; do
    # The extension's first call for an originator after the TRUNCATE also scans
    # it once (its high-water mark, see src/store/feed/highwater.rs); N1 covers that
    # call for each of the 4 originators, so the difference is the steady state.
    case $variant in
    bulk_*) n1=40000 n2=80000 ;;
    batch_*|late_batch_*) n1=1000 n2=3000 ;;
    *) n1=500 n2=1500 ;;
    esac
    i1=$(instructions "$variant" "$n1")
    i2=$(instructions "$variant" "$n2")
    per_row=$(( (i2 - i1) / (n2 - n1) ))
    printf '%s\t%s\n' "$variant" "$per_row" >>"$out"
    log "instructions per row, $variant: $per_row"
done
