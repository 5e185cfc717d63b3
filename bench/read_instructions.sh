#!/usr/bin/env bash
# Instructions per call of each read function, counted by valgrind (callgrind)
# in a single-user backend: repeatable to a fraction of a percent, so a change
# that should not touch the read paths (a reshaping of the code) can be held to
# the same count.
#
# usage: bench/read_instructions.sh [OUT.tsv]
#
# The data is bench/sql/read_setup.sql's at 50 leaf partitions (5 originators x
# 10 bands of 100 ids) with bench/sql/shapes_setup.sql's cursors: the shapes of
# `bench/run.sh --only shapes`. Each variant runs twice in a fresh single-user
# backend, N1 and N2 calls of a PREPAREd statement; (instructions(N2) -
# instructions(N1)) / (N2 - N1) is what one more call costs. Expects the
# extension installed (bench/run.sh installs the release build first).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

out=${1:-bench/out/read_instructions.tsv}
mkdir -p "$(dirname "$out")"
: >"$out"
name=ricount
dir="$ENVELOPES_TMP/$name"
port=$(free_port)
cluster_start "$name" "$port" "autovacuum = off" "shared_buffers = 256MB" "jit = off"
trap 'cluster_stop "$name"; rm -rf "${ENVELOPES_TMP:?}/$name"' EXIT
cluster_psql "$name" "$port" postgres -q -c "CREATE DATABASE ricount"
cluster_psql "$name" "$port" ricount -q -v nodes=5 -v bands=10 -f bench/sql/read_setup.sql >/dev/null
cluster_psql "$name" "$port" ricount -q -f bench/sql/shapes_setup.sql >/dev/null
cluster_stop "$name"

# The statement each variant PREPAREs (s) and EXECUTEs.
statement() {
    case $1 in
    originator) echo "SELECT count(*), sum(pg_catalog.length(r.originator_envelope)) FROM envelopes.select_originator(3, 0, 1000) r" ;;
    select) echo "SELECT count(*), sum(pg_catalog.length(r.originator_envelope)) FROM envelopes.select_gateway_envelopes('{}', '{}', NULL, '{3}', 1000) r" ;;
    select_all) echo "SELECT count(*), sum(pg_catalog.length(r.originator_envelope)) FROM bench_cursor c, envelopes.select_gateway_envelopes(c.nodes, c.seqs, NULL, NULL, 1000) r" ;;
    poll) echo "SELECT count(*) FROM bench_cursor c, envelopes.select_originator(1, c.seqs[1], 1000) r" ;;
    topics) echo "SELECT count(*), sum(pg_catalog.length(r.originator_envelope)) FROM bench_topic_cursor c, envelopes.select_by_topic_cursors(c.topics, c.nodes, c.seqs, 100, 1000) r" ;;
    wave) echo "SELECT count(*), sum(pg_catalog.length(r.originator_envelope)) FROM bench_topic_cursor c, bench_ceilings l, envelopes.select_wave(c.topics, c.nodes, c.seqs, l.nodes, l.seqs, row_limit => 1000) r" ;;
    newest) echo "SELECT count(*), sum(pg_catalog.length(r.originator_envelope)) FROM envelopes.select_newest_by_topic(ARRAY[pg_catalog.int4send(0), pg_catalog.int4send(1), pg_catalog.int4send(2), pg_catalog.int4send(3)]) r" ;;
    maxima) echo "SELECT count(*), sum(r.max_sequence_id) FROM bench_cursor c, envelopes.originator_maxima(c.nodes) r" ;;
    ceilings) echo "SELECT count(*), sum(r.max_sequence_id) FROM envelopes.originator_ceilings() r" ;;
    view) echo "SELECT count(*), sum(pg_catalog.length(originator_envelope)) FROM envelopes.gateway_envelopes_view WHERE originator_node_id = 3 AND originator_sequence_id BETWEEN 1 AND 100" ;;
    esac
}

# instructions VARIANT N: total instructions of a single-user backend making N
# calls of the variant's statement.
instructions() {
    local variant=$1 n=$2 script="$dir/script.sql" i
    {
        echo "PREPARE s AS $(statement "$variant");"
        for ((i = 0; i < n; i++)); do echo "EXECUTE s;"; done
    } >"$script"
    chown postgres "$script"
    as_postgres valgrind --tool=callgrind --callgrind-out-file=/dev/null \
        "$PG_BIN/postgres" --single -D "$dir/data" -c jit=off ricount \
        <"$script" 2>"$dir/valgrind.log" >"$dir/single.log"
    if grep -q "ERROR" "$dir/single.log"; then
        grep -m3 "ERROR" "$dir/single.log" >&2
        return 1
    fi
    awk '/Collected :/ { print $4 }' "$dir/valgrind.log"
}

for variant in originator select select_all poll topics wave newest maxima ceilings view; do
    n1=10 n2=30
    i1=$(instructions "$variant" "$n1")
    i2=$(instructions "$variant" "$n2")
    per_call=$(( (i2 - i1) / (n2 - n1) ))
    printf '%s\t%s\n' "$variant" "$per_call" >>"$out"
    log "instructions per call, $variant: $per_call"
done
