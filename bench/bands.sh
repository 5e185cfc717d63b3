#!/usr/bin/env bash
# Cost of a store with many bands, on a throwaway cluster with default settings
# (max_locks_per_transaction 64, max_connections 100):
#   1. creating a band as the store grows: 1,000 bands of one originator in
#      chunks of 100, in the inserting transaction and in the worker; ms per band
#      of each chunk (a flat line is the goal);
#   2. 10,000 bands over 100 originators (in the transaction), total seconds;
#   3. at those 10,000 bands, with rows in three bands of each originator: each
#      whole-store function's time and the locks its transaction holds after it.
# Uses the installed extension (install a release build first:
# scripts/lib.sh install_extension release), or the one under $PG_BIN.
#   bench/bands.sh [report-file]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
out=${1:-/dev/stdout}
port=$(free_port)
trap 'cluster_stop bench_bands' EXIT
cluster_start bench_bands "$port" >/dev/null
P="host=127.0.0.1 port=$port user=postgres"
psql() { "$PG_BIN/psql" -X -q -At "$@"; }
psql "$P dbname=postgres" -c "CREATE DATABASE b"
psql "$P dbname=b" -c "CREATE EXTENSION pg_envelopes"
now() { date +%s.%N; }
{
echo "| chunk of 100 bands (one originator) | in the transaction, ms/band | in the worker, ms/band |"
echo "|---|---|---|"
for chunk in $(seq 0 9); do
    row="| bands $((chunk * 100 + 1))-$(((chunk + 1) * 100)) |"
    for mode in transaction worker; do
        node=$([ "$mode" = transaction ] && echo 1 || echo 2)
        t0=$(now)
        psql "$P dbname=b" -c "SET envelopes.band_width = 1000" -c "SET envelopes.create_partitions_in = '$mode'" \
            -c "SELECT count(envelopes.ensure_gateway_parts($node, s * 1000 + 1) IS NULL)
                  FROM generate_series($((chunk * 100)), $((chunk * 100 + 99))) s" >/dev/null
        t1=$(now)
        row+=" $(python3 -c "print(f'{($t1 - $t0) * 1000 / 100:.1f}')") |"
    done
    echo "$row"
done
echo
psql "$P dbname=postgres" -c "CREATE DATABASE big"
psql "$P dbname=big" -c "CREATE EXTENSION pg_envelopes" \
    -c "CREATE PROCEDURE mk() LANGUAGE plpgsql AS \$\$ BEGIN
          FOR n IN 1..100 LOOP
            PERFORM envelopes.ensure_gateway_parts(n, s * 1000 + 1) FROM generate_series(0, 99) s;
            COMMIT;
          END LOOP; END \$\$"
t0=$(now)
psql "$P dbname=big" -c "SET envelopes.band_width = 1000" -c "SET envelopes.create_partitions_in = 'transaction'" -c "CALL mk()"
t1=$(now)
echo "10,000 bands over 100 originators, in the transaction: $(python3 -c "print(f'{$t1 - $t0:.1f}')") s"
echo
psql "$P dbname=big" -c "SELECT count(envelopes.insert_gateway_envelope(n, s, CASE WHEN s % 2 = 0 THEN '\\x0a'::bytea ELSE '\\x0b' END, '\\x02'))
                           FROM generate_series(1, 100) n, (VALUES (5), (50006), (99001)) v(s)" >/dev/null
echo "| at 10,000 bands (300 rows) | ms | locks held after it |"
echo "|---|---|---|"
for q in "select_gateway_envelopes(row_limit => 1000)" \
         "select_gateway_envelopes(topics => ARRAY['\\x0a'::bytea], row_limit => 1000)" \
         "select_newest_by_topic(ARRAY['\\x0a'::bytea, '\\x0b'::bytea])" \
         "orphaned_envelopes()" "originator_ceilings()"; do
    t0=$(now)
    locks=$(psql "$P dbname=big" -c "BEGIN" -c "SELECT count(*) FROM envelopes.$q" \
        -c "SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid()" -c "COMMIT" 2>&1 | tail -1)
    t1=$(now)
    echo "| \`$q\` | $(python3 -c "print(f'{($t1 - $t0) * 1000:.0f}')") | $locks |"
done
echo
echo "\`prune_expired(in_transaction => true)\` at 10,000 bands: $(psql "$P dbname=big" \
    -c "SELECT count(*) FROM envelopes.prune_expired(in_transaction => true)" 2>&1 | head -1)"
echo
echo "store_size(): $(psql "$P dbname=big" -c "SELECT originators || ' originators, ' || bands || ' bands, ' || whole_store_locks || ' locks for a whole-store statement, lock table ' || lock_table_size FROM envelopes.store_size()")"
} >"$out"
