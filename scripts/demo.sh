#!/usr/bin/env bash
# The main job, end to end on a fresh machine: set up, build, install the extension
# into a throwaway cluster, insert envelopes across new originators and sequence
# bands, show what landed, run the bridge to stdout and show what it forwarded,
# a late arrival, and a summary. Setup and build output go to a log file (its
# path is printed); each step shows a few lines.
#
#   scripts/demo.sh [--debug] [--keep] [--shards]
#
#   --debug   debug build (compiles faster, runs slower)
#   --keep    leave the cluster (and the shards) running; the summary says how
#             to connect and how to stop them
#   --shards  then the same calls through pg_envelopes_router in front of 2
#             shards (scripts/shards.sh)
set -euo pipefail
cd "$(dirname "$0")/.."

profile=release keep=false shards=false
for arg in "$@"; do
    case "$arg" in
        --debug) profile=debug ;;
        --keep) keep=true ;;
        --shards) shards=true ;;
        *) echo "usage: $0 [--debug] [--keep] [--shards]" >&2; exit 2 ;;
    esac
done

source scripts/lib.sh
install -d -o postgres -g postgres "$ENVELOPES_TMP"
buildlog="$ENVELOPES_TMP/demo-build.log"
: >"$buildlog"
started=$(date +%s)
elapsed() { echo "$(( $(date +%s) - started ))s"; }
# quietly CMD...: runs CMD with its output in the build log; on failure shows
# the end of the log.
quietly() {
    "$@" >>"$buildlog" 2>&1 && return 0
    tail -n 30 "$buildlog" >&2
    log "failed: $* (whole log: $buildlog)"
    exit 1
}

echo "pg_envelopes demo ($profile build). Setup and build output: $buildlog"
echo "setting up the machine (scripts/setup.sh: Postgres 15, clang, cargo-pgrx, message buses; ~10 min the first time)"
quietly scripts/setup.sh
echo "building the bridge and the extension, installing the extension (a few minutes the first time)"
quietly cargo build $([ "$profile" = release ] && echo --release) -p envelopes-bridge
bridge="target/$profile/envelopes-bridge"
quietly install_extension "$profile"
echo "ready after $(elapsed)"

port=$(free_port)
shards_dir=""
cleanup() {
    $keep && return 0
    cluster_stop demo
    [ -z "$shards_dir" ] || scripts/shards.sh down "$shards_dir" 2>/dev/null || true
}
trap cleanup EXIT
cluster_start demo "$port"
sql() { cluster_psql demo "$port" postgres "$@"; }
q() { sql -qAt "$@"; }   # one value, or rows without headers
q -c "CREATE EXTENSION pg_envelopes"
echo "throwaway cluster on 127.0.0.1:$port ($ENVELOPES_TMP/demo), CREATE EXTENSION pg_envelopes; bands of 1,000 ids"
sql -q -c "ALTER DATABASE postgres SET envelopes.band_width = 1000"

echo
echo "== 1. Three new originators, one envelope at a time"
q -F ' ' <<'SQL'
SELECT format('(%s, %s) inserted %s', node, seq,
              envelopes.insert_gateway_envelope(node, seq, convert_to('topic-' || node, 'UTF8'),
                                                convert_to('envelope ' || node || ':' || seq, 'UTF8')))
  FROM (VALUES (10, 1), (10, 999), (10, 1000), (20, 5), (30, 123456)) AS v(node, seq);
SELECT format('(10, 1) again: inserted %s (already stored: a replay is harmless)',
              envelopes.insert_gateway_envelope(10, 1, '\x00', '\x00'));
SQL
echo "each call created what it needed: the originator's partitions and the band of its id"
declare -A before_max
while read -r node max; do before_max[$node]=$max; done < <(q -F ' ' -c \
    "SELECT originator_node_id, max(originator_sequence_id) FROM envelopes.gateway_envelopes_meta GROUP BY 1")

echo
echo "== 2. A batch of 5,000 envelopes: ids 1-5000 dealt round-robin to originators 10, 20, 30, 40, 50"
batch_keys="SELECT 10 * (1 + i % 5) AS node, i::bigint AS seq FROM generate_series(1, 5000) AS i"
already=$(q -c "SELECT string_agg(format('(%s, %s)', k.node, k.seq), ', ') FROM ($batch_keys) k
                 JOIN envelopes.gateway_envelopes_meta m ON (m.originator_node_id, m.originator_sequence_id) = (k.node, k.seq)")
inserted=$(q <<SQL
SELECT envelopes.insert_gateway_envelopes(
           array_agg(node), array_agg(seq),
           array_agg(convert_to('topic-' || (seq % 7), 'UTF8')),
           array_agg(convert_to(repeat('x', (100 + seq % 50)::int), 'UTF8')))
  FROM ($batch_keys) k;
SQL
)
echo "inserted $inserted of 5000 rows in one call, across $(q -c "SELECT count(*) FROM envelopes.partitions()") band partitions now"
if [ -n "$already" ]; then
    echo "the batch repeats $already, stored in step 1: a key already stored counts 0, as a replay would"
fi
echo "$(q -c "SELECT count(*) FROM envelopes.gateway_envelopes_meta WHERE late") of them arrived late (step 6 says why), recorded in $(q -c "SELECT count(*) FROM envelopes.late_envelopes") late-feed entries (one per originator)"

echo
echo "== 3. What landed, per originator (every band: SELECT * FROM envelopes.partitions())"
sql -q <<'SQL'
SELECT p.originator_node_id AS originator, count(*) AS bands,
       min(p.band_start) AS first_band, max(p.band_start) AS last_band,
       (SELECT count(*) FROM envelopes.gateway_envelopes_meta m WHERE m.originator_node_id = p.originator_node_id) AS envelopes,
       (SELECT count(*) FROM envelopes.gateway_envelopes_meta m WHERE m.originator_node_id = p.originator_node_id AND m.late) AS late
  FROM envelopes.partitions() p GROUP BY 1 ORDER BY 1;
SQL

echo "== 4. A read of originator 20 past id 3500 through the view touches only its partitions"
sql -q -c "ANALYZE envelopes.gateway_envelopes_meta, envelopes.gateway_envelopes_blob"
plan=$(q <<'SQL'
EXPLAIN (COSTS OFF)
SELECT originator_sequence_id, topic, originator_envelope FROM envelopes.gateway_envelopes_view
 WHERE originator_node_id = 20 AND originator_sequence_id > 3500
 ORDER BY originator_sequence_id LIMIT 5;
SQL
)
scanned=$(printf '%s\n' "$plan" | grep -o ' on gateway_envelopes_meta_o[0-9_s]*' | sed 's/ on //' | sort -u)
echo "the plan scans $(echo "$scanned" | wc -l) of $(q -c "SELECT count(*) FROM envelopes.partitions()") meta bands: $(echo $scanned)"
echo "(blob is read by key for the rows returned; the whole plan: EXPLAIN that query in psql)"

echo
echo "== 5. The bridge forwards what committed (to stdout, JSON lines), then stops"
q -c "SELECT envelopes.publish('orders.created', convert_to('{\"order\": 42}', 'UTF8'), '{\"trace\": \"demo\"}')" >/dev/null
forwarded="$ENVELOPES_TMP/demo/forwarded.jsonl"
url="postgres://postgres@127.0.0.1:$port/postgres"
# forward OUT: runs the bridge to stdout (into OUT) until the consumer has nothing
# left to acknowledge, then stops it.
forward() {
    "$bridge" egress --database-url "$url" --name demo --register --sink stdout >"$1" 2>>"$ENVELOPES_TMP/demo/bridge.log" &
    local bridge_pid=$! pending
    for _ in $(seq 150); do
        pending=$(q -c "SELECT COALESCE(outbox_pending + envelopes_pending, -1) FROM envelopes.consumer_status WHERE consumer = 'demo'" 2>/dev/null || echo -1)
        [ "$pending" = 0 ] && break
        sleep 0.2
    done
    kill -TERM "$bridge_pid"; wait "$bridge_pid" || true
}
forward "$forwarded"
echo "forwarded $(wc -l <"$forwarded") messages ($(grep -c '"kind":"envelope"' "$forwarded") envelopes, $(grep -c '"kind":"outbox"' "$forwarded") outbox) into $forwarded; two of them:"
grep -m 1 '"id":"20:5"' "$forwarded"
grep -m 1 '"kind":"outbox"' "$forwarded"

echo
echo "== 6. A late arrival: originator 20's id 4 commits after its id 5 was forwarded"
q -c "SELECT envelopes.insert_gateway_envelope(20, 4, convert_to('topic-20', 'UTF8'), convert_to('retried envelope 20:4', 'UTF8'))" >/dev/null
echo "the late feed of originator 20 (envelopes.late_envelopes):"
sql -q -c "SELECT id AS entry, originator_node_id, originator_sequence_id AS first_id, last_sequence_id AS last_id, recorded_at FROM envelopes.late_envelopes WHERE originator_node_id = 20 ORDER BY id"
# Why the batch of step 2 made late rows: per originator, its batch rows below
# the highest id it already had.
nodes=() maxima=() counts=()
while read -r node n; do
    nodes+=("$node"); maxima+=("${before_max[$node]}"); counts+=("$n")
done < <(q -F ' ' -c "SELECT originator_node_id, count(*) FROM envelopes.gateway_envelopes_meta
                       WHERE late AND (originator_node_id, originator_sequence_id) <> (20, 4) GROUP BY 1 ORDER BY 1")
# list A B C -> "A, B and C"
list() { local IFS=,; local all="$*"; all=${all//,/, }; [ $# -gt 1 ] && all="${all%, *} and ${all##*, }"; echo "$all"; }
total_late=$(q -c "SELECT count(*) FROM envelopes.gateway_envelopes_meta WHERE late AND (originator_node_id, originator_sequence_id) <> (20, 4)")
echo "Why $total_late more from the batch of step 2: originators $(list "${nodes[@]}") already had ids $(list "${maxima[@]}")"
echo "from step 1, so the batch's $(list "${counts[@]}") rows below those landed below a row already stored: late,"
echo "recorded in this feed (one entry per originator for the batch, one for the retried id 4) so that"
echo "a consumer whose cursor has passed their ids still gets them."
forward "$forwarded.late"
echo "the bridge, started again, forwarded $(wc -l <"$forwarded.late") message:"
cat "$forwarded.late"

if $shards; then
    echo
    echo "== 7. Past one machine: pg_envelopes_router in a proxy database in front of 2 shards"
    if $keep; then
        shards_dir=$(scripts/shards.sh up 2 2>>"$buildlog")
    else
        shards_dir=$(ENVELOPES_SHARDS_OWNER=$$ scripts/shards.sh up 2 2>>"$buildlog")
    fi
    source "$shards_dir/env"
    psql_proxy() { "$PG_BIN/psql" -X -v ON_ERROR_STOP=1 "$PROXY_CONNSTR" "$@"; }
    echo "the application connects to the proxy ($PROXY_CONNSTR) and calls the same functions:"
    psql_proxy -qAt -c "SELECT envelopes.insert_gateway_envelopes(array_agg(o), array_agg(s::bigint),
           array_agg(convert_to('topic-' || o, 'UTF8')), array_agg(convert_to('envelope ' || o || ':' || s, 'UTF8')))
      FROM generate_series(1, 8) o, generate_series(1, 3) s" | sed 's/^/inserted /; s/$/ rows (originators 1-8, ids 1-3) in one call, split by shard/'
    for i in 0 1; do
        echo "shard $i (port ${SHARD_PORTS[$i]}) holds originators $(cluster_psql x "${SHARD_PORTS[$i]}" envelopes -At \
            -c "SELECT string_agg(originator_node_id::text, ',' ORDER BY 1) FROM envelopes.originator_ceilings()")"
    done
    echo "a read through the proxy merges the shards (cursor: originator 1 at id 2, originator 2 at id 3):"
    psql_proxy -q -c "SELECT originator_node_id, originator_sequence_id, convert_from(originator_envelope, 'UTF8') AS envelope
      FROM envelopes.select_gateway_envelopes(cursor_node_ids => '{1,2}', cursor_sequence_ids => '{2,3}', row_limit => 4)"
fi

echo
echo "== Summary"
IFS='|' read -r rows originators bands orphans < <(q -c "
    SELECT (SELECT count(*) FROM envelopes.gateway_envelopes_view),
           (SELECT count(DISTINCT originator_node_id) FROM envelopes.partitions()),
           (SELECT count(*) FROM envelopes.partitions()),
           (SELECT count(*) FROM envelopes.orphaned_envelopes())")
IFS='|' read -r late dead lag < <(q -c "
    SELECT (SELECT count(*) FROM envelopes.gateway_envelopes_meta WHERE late),
           (SELECT count(*) FROM envelopes.consumer_dead_letters('demo')),
           envelopes.consumer_lag('demo')")
sent=$(cat "$forwarded" "$forwarded.late" | wc -l)
printf '  %-14s %s\n' \
    "envelopes" "$rows from $originators originators (meta and blob, inserted one by one and in a batch)" \
    "partitions" "$bands bands of 1,000 ids, each a meta and a blob partition, all created on demand" \
    "forwarded" "$sent messages by the bridge (consumer demo): every envelope once, and the outbox message" \
    "late" "$late envelopes arrived below an id already stored (steps 2 and 6), all forwarded" \
    "dead letters" "$dead (rows a bus refused, set aside)" \
    "lag" "$lag (ids committed but not yet acknowledged by consumer demo)" \
    "orphans" "$orphans (meta rows without their blob row, or the reverse)"
if $shards; then
    printf '  %-14s %s\n' "shards" "2 shards and a proxy: $shards_dir (source $shards_dir/env)"
fi
printf '  %-14s %s\n' "build log" "$buildlog" "took" "$(elapsed)"
if $keep; then
    echo "The cluster is still running:"
    echo "  psql -h 127.0.0.1 -p $port -U postgres"
    echo "  $bridge status --database-url $url"
    echo "  stop it: runuser -u postgres -- $PG_BIN/pg_ctl -D $ENVELOPES_TMP/demo/data stop"
    if $shards; then
        echo "  the shards: psql \"$PROXY_CONNSTR\"; stop them: scripts/shards.sh down $shards_dir"
    fi
else
    echo "The cluster is stopped (its files stay in $ENVELOPES_TMP/demo); scripts/demo.sh --keep leaves it running."
fi
