#!/usr/bin/env bash
# The main job, end to end on a fresh machine: set up, build, install the extension
# into a throwaway cluster, insert envelopes across new originators and sequence
# bands, show what landed, then run the bridge to stdout and show what it forwarded. Options: --debug (debug build, faster to compile),
# --keep (leave the cluster running and print how to connect), --shards (then the
# same through pg_envelopes_router in front of 2 shards, scripts/shards.sh).
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

scripts/setup.sh
source scripts/lib.sh
install_extension "$profile"

port=$(free_port)
cluster_start demo "$port"
$keep || trap 'cluster_stop demo' EXIT
log "throwaway cluster on 127.0.0.1:$port ($ENVELOPES_TMP/demo)"
sql() { cluster_psql demo "$port" postgres "$@"; }

sql -q <<'SQL'
CREATE EXTENSION pg_envelopes;
SQL

echo
echo "== Envelopes from three new originators, one by one, across band boundaries"
sql <<'SQL'
SET envelopes.band_width = 1000;
SELECT node AS originator, seq AS sequence_id,
       envelopes.insert_gateway_envelope(node, seq, convert_to('topic-' || node, 'UTF8'),
                                         convert_to('envelope ' || node || ':' || seq, 'UTF8')) AS inserted
  FROM (VALUES (10, 1), (10, 999), (10, 1000), (20, 5), (30, 123456)) AS v(node, seq);
-- The same envelope again: idempotent, 0 inserted.
SELECT envelopes.insert_gateway_envelope(10, 1, '\x00', '\x00') AS inserted_again;
SQL

echo
echo "== A batch of 5,000 envelopes over five originators (two of them new) and many bands"
sql <<'SQL'
SET envelopes.band_width = 1000;
SELECT envelopes.insert_gateway_envelopes(
           array_agg(10 * (1 + i % 5)),
           array_agg(i::bigint),
           array_agg(convert_to('topic-' || (i % 7), 'UTF8')),
           array_agg(convert_to(repeat('x', 100 + i % 50), 'UTF8'))) AS inserted
  FROM generate_series(1, 5000) AS i;
SQL

echo
echo "== What landed: every band partition, its bounds and its rows"
sql <<'SQL'
SELECT parent.relname AS originator_partition, leaf.relname AS band_partition,
       pg_get_expr(leaf.relpartbound, leaf.oid) AS bounds,
       (xpath('/row/n/text()', query_to_xml(format('SELECT count(*) AS n FROM envelopes.%I', leaf.relname), false, true, '')))[1]::text::int AS rows
  FROM pg_inherits i
  JOIN pg_class leaf ON leaf.oid = i.inhrelid AND leaf.relkind = 'r'
  JOIN pg_class parent ON parent.oid = i.inhparent
 WHERE leaf.relname LIKE 'gateway\_envelopes\_meta\_%'
 ORDER BY parent.relname, (regexp_match(leaf.relname, '_s(\d+)_'))[1]::bigint;
SELECT originator_node_id AS originator, count(*) AS envelopes,
       min(originator_sequence_id) AS first_seq, max(originator_sequence_id) AS last_seq
  FROM envelopes.gateway_envelopes_view GROUP BY 1 ORDER BY 1;
SELECT count(*) AS orphans FROM envelopes.orphaned_envelopes();
SQL

echo
echo "== A read through the view touches only that originator's partitions"
sql <<'SQL'
ANALYZE envelopes.gateway_envelopes_meta, envelopes.gateway_envelopes_blob;
EXPLAIN (COSTS OFF)
SELECT originator_sequence_id, topic FROM envelopes.gateway_envelopes_view
 WHERE originator_node_id = 20 AND originator_sequence_id > 3500
 ORDER BY originator_sequence_id LIMIT 5;
SQL

echo
echo "== The bridge forwards what committed, to stdout (JSON lines), then stops"
cargo build --quiet $([ "$profile" = release ] && echo --release) -p envelopes-bridge
bridge="target/$profile/envelopes-bridge"
sql -q -c "SELECT envelopes.publish('orders.created', convert_to('{\"order\": 42}', 'UTF8'), '{\"trace\": \"demo\"}')" >/dev/null
forwarded="$ENVELOPES_TMP/demo/forwarded.jsonl"
url="postgres://postgres@127.0.0.1:$port/postgres"
# forward OUT: runs the bridge to stdout (into OUT) until the consumer has nothing
# left to acknowledge, then stops it.
forward() {
    "$bridge" egress --database-url "$url" --name demo --register --sink stdout >"$1" 2>>"$ENVELOPES_TMP/demo/bridge.log" &
    local bridge_pid=$! pending
    for _ in $(seq 100); do
        pending=$(sql -At -c "SELECT COALESCE(outbox_pending + envelopes_pending, -1) FROM envelopes.consumer_status WHERE consumer = 'demo'" 2>/dev/null || echo -1)
        [ "$pending" = 0 ] && break
        sleep 0.2
    done
    kill -TERM "$bridge_pid"; wait "$bridge_pid" || true
}
forward "$forwarded"
echo "forwarded $(wc -l <"$forwarded") messages; the first three and the outbox one:"
head -n 3 "$forwarded"
grep '"kind":"outbox"' "$forwarded" | head -n 1

echo
echo "== A late arrival: originator 20's sequence id 4 commits after 5 was forwarded"
sql -q -c "SELECT envelopes.insert_gateway_envelope(20, 4, convert_to('topic-20', 'UTF8'), convert_to('retried envelope 20:4', 'UTF8'))" >/dev/null
sql -c "SELECT id AS late_feed_id, originator_node_id, originator_sequence_id FROM envelopes.late_envelopes"
forward "$forwarded.late"
echo "the bridge, started again, forwarded:"
cat "$forwarded.late"
echo
"$bridge" status --database-url "$url"

if $shards; then
    echo
    echo "== Past one machine: pg_envelopes_router in a proxy database in front of 2 shards"
    proxy=$(scripts/shards.sh up 2)
    $keep || trap 'cluster_stop demo; scripts/shards.sh down 2>/dev/null' EXIT
    source "$ENVELOPES_TMP/shards/env"
    psql_proxy() { "$PG_BIN/psql" -X -v ON_ERROR_STOP=1 "$proxy" "$@"; }
    echo "the application connects to the proxy ($proxy) and calls the same functions:"
    psql_proxy -c "SELECT * FROM envelopes_router.shards()"
    psql_proxy <<'SQL'
SELECT envelopes.insert_gateway_envelopes(array_agg(o), array_agg(s::bigint),
           array_agg(convert_to('topic-' || o, 'UTF8')), array_agg(convert_to('envelope ' || o || ':' || s, 'UTF8')))
  FROM generate_series(1, 8) o, generate_series(1, 3) s;
SELECT originator_node_id, envelopes_router.shard_of(originator_node_id) AS on_shard, max_sequence_id
  FROM envelopes.originator_ceilings();
SELECT originator_node_id, originator_sequence_id, convert_from(originator_envelope, 'UTF8') AS envelope
  FROM envelopes.select_gateway_envelopes(cursor_node_ids => '{1,2}', cursor_sequence_ids => '{2,3}', row_limit => 6);
SQL
    for i in 0 1; do
        echo "shard $i holds originators: $(cluster_psql "shards/shard$i" "${SHARD_PORTS[$i]}" envelopes -At \
            -c "SELECT string_agg(originator_node_id::text, ',' ORDER BY 1) FROM envelopes.originator_ceilings()")"
    done
fi

if $keep; then
    log "cluster left running: psql -h 127.0.0.1 -p $port -U postgres"
fi
