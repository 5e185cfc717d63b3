#!/usr/bin/env bash
# The maintenance worker (src/store/maintenance/), as the README describes it
# (run by scripts/test.sh). A private cluster with pg_envelopes in
# shared_preload_libraries, bands of 1,000 ids, envelopes.premake_fraction 0.8,
# and envelopes.maintenance_databases naming "app" (which holds the extension),
# a database that does not exist and "postgres" (which lacks the extension).
# Checked:
#   1. bad values of the three settings are refused (22023) and the good ones
#      stay; with envelopes.maintenance_interval at its default 0 nothing runs:
#      no run is recorded and expired rows stay;
#   2. at 1 second (ALTER SYSTEM, reload), within two intervals: originator 1's
#      expired rows are deleted and its emptied bands dropped, originator 2's
#      next band is created (its newest is 90% full), and the runs are recorded
#      without error; the databases that cannot be maintained are skipped;
#   3. a long transaction holds originator 3's newest band in ACCESS EXCLUSIVE
#      mode (and fills it to 95%, uncommitted): runs fail after
#      envelopes.partition_lock_timeout, are recorded with the lock error (55P03)
#      and logged, and the band after it is not created;
#   4. once that transaction commits, the next run creates the band and is
#      recorded without error;
#   5. after a server restart the launcher is back and runs go on;
#   6. back at 0 (reload), nothing runs any more;
#   throughout, the postmaster never restarted (same start time, no crash in
#   its log).
# Needs the extension installed (scripts/test.sh installs it first).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

port=$(free_port)
holders=()
cleanup() {
    local p
    for p in "${holders[@]}"; do kill "$p" 2>/dev/null || true; done
    cluster_stop maintenance
}
trap 'cleanup' EXIT
cluster_start maintenance "$port" \
    "shared_preload_libraries = 'pg_envelopes'" \
    "envelopes.maintenance_databases = 'app, nosuchdb, postgres'" \
    "envelopes.premake_fraction = 0.8" \
    "envelopes.band_width = 1000" \
    "envelopes.partition_lock_timeout = 500" \
    "max_worker_processes = 16"
log="$ENVELOPES_TMP/maintenance/server.log"
sql() { cluster_psql maintenance "$port" "$@"; }
fail() { log "FAIL: $*"; tail -n 30 "$log" >&2; exit 1; }
wait_until() { # wait_until SECONDS WHAT CODE: until the shell code CODE succeeds (run again each time)
    local deadline=$(( $(date +%s) + $1 ))
    until eval "$3"; do
        [ "$(date +%s)" -lt "$deadline" ] || fail "$(eval "echo \"$2\"")"
        sleep 0.3
    done
}

sql postgres -q -c "CREATE DATABASE app"
sql app -q -c "CREATE EXTENSION pg_envelopes"
started_at=$(sql app -At -c "SELECT pg_postmaster_start_time()")
launcher() { sql app -At -c "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg_envelopes maintenance launcher'"; }
[ "$(launcher)" = 1 ] || fail "no maintenance launcher is running"

# 1. Bad values are refused, with the SQLSTATE of an invalid value.
for bad in "envelopes.maintenance_interval = -1" "envelopes.maintenance_interval = '1 fortnight'" \
           "envelopes.premake_fraction = 1.5" "envelopes.premake_fraction = -0.1" \
           "envelopes.maintenance_databases = 'app,,other'" "envelopes.maintenance_databases = '\"app'"; do
    out=$(sql app -v VERBOSITY=verbose -c "ALTER SYSTEM SET $bad" 2>&1) && fail "ALTER SYSTEM SET $bad was accepted"
    grep -q 22023 <<<"$out" || fail "ALTER SYSTEM SET $bad: not 22023: $out"
done
[ "$(sql app -At -c "SHOW envelopes.premake_fraction")" = 0.8 ] || fail "premake_fraction changed"
[ "$(sql app -At -c "SHOW envelopes.maintenance_interval")" = 0 ] || fail "maintenance is not off by default"
log "bad settings refused; maintenance off by default"

now() { sql app -At -c "SELECT extract(epoch FROM now())::bigint"; }
# insert NODE FROM TO EXPIRY: ids FROM..TO of originator NODE (EXPIRY: SQL, NULL = never).
insert() {
    sql app -q -o /dev/null -c "SELECT envelopes.insert_gateway_envelopes(
        array_agg($1), array_agg(s::bigint), array_agg('\x01'::bytea), array_agg('\xcafe'::bytea),
        NULL, NULL, array_agg(($4)::bigint)) FROM generate_series($2, $3) s"
}
# Originator 1: ids 1-1500 expired, 2500 never expires (bands 0 and 1000 are
# emptied and dropped; band 2000 stays, half full). Originator 2: 1-900 (band 0
# is 90% full: band 1000 is created ahead). Originator 3: band 0, empty.
insert 1 1 1500 "extract(epoch FROM now()) - 3600"
insert 1 2500 2500 NULL
insert 2 1 900 NULL
sql app -q -o /dev/null -c "SELECT envelopes.ensure_gateway_parts(3, 1)"
expired() { sql app -At -c "SELECT count(*) FROM envelopes.gateway_envelopes_meta WHERE originator_node_id = $1 AND expiry < extract(epoch FROM now())"; }
# Bands from the catalog alone (partitions() would wait for a locked band's size).
bands() { sql app -At -c "SELECT coalesce(string_agg(band_start::text, ',' ORDER BY band_start), '') FROM envelopes._bands() WHERE originator_node_id = $1"; }
runs() { sql app -At -c "SELECT count(*) FROM envelopes.maintenance_runs $*"; }
run_list() { sql app -At -c "SELECT string_agg(format('#%s %s dropped %s created %s deleted %s%s', run_id, CASE WHEN finished IS NULL THEN 'running' ELSE 'done' END, bands_dropped, bands_created, rows_deleted, coalesce(' error: ' || error, '')), E'\n' ORDER BY run_id) FROM envelopes.maintenance_runs"; }

sleep 3
[ "$(runs)" = 0 ] || fail "a run was recorded with maintenance off: $(run_list)"
[ "$(expired 1)" = 1500 ] || fail "expired rows were deleted with maintenance off"
[ "$(bands 2)" = 0 ] || fail "a band was created ahead with maintenance off (bands of originator 2: $(bands 2))"
log "with envelopes.maintenance_interval = 0 nothing ran"

# 2. On, every second.
sql app -q -c "ALTER SYSTEM SET envelopes.maintenance_interval = 1" -c "SELECT pg_reload_conf()" -o /dev/null
on=$(date +%s)
pruned() { [ "$(expired 1)" = 0 ] && [ "$(bands 1)" = 2000 ]; }
premade() { [ "$(bands 2)" = 0,1000 ]; }
wait_until 5 'originator 1 not pruned within two intervals (bands $(bands 1), $(expired 1) expired; runs: $(run_list))' pruned
wait_until 5 'originator 2'"'"'s next band not created within two intervals (bands $(bands 2); runs: $(run_list))' premade
log "pruned and created ahead $(( $(date +%s) - on ))s after turning it on"
finished_runs() { [ "$(runs "WHERE finished IS NOT NULL")" -ge 1 ]; }
wait_until 5 'no finished run' finished_runs
[ "$(runs "WHERE error IS NOT NULL")" = 0 ] || fail "a run failed: $(run_list)"
totals=$(sql app -At -c "SELECT sum(rows_deleted), sum(bands_dropped), sum(bands_created) FROM envelopes.maintenance_runs")
[ "$totals" = "1500|2|1" ] || fail "the runs recorded deleted|dropped|created $totals, not 1500|2|1: $(run_list)"
[ "$(sql app -At -c "SELECT count(*) FROM envelopes.gateway_envelopes_meta")" = 901 ] || fail "rows that have not expired were deleted"
[ "$(bands 3)" = 0 ] || fail "originator 3's empty band got a next one"
grep -q 'database "nosuchdb" does not exist' "$log" || fail "the missing database is not reported in the log"
grep -q 'pg_envelopes is not installed in this database' "$log" || fail "the database without the extension is not reported in the log"
log "runs recorded: $(sql app -At -c "SELECT count(*) || ' runs, ' || sum(rows_deleted) || ' rows deleted, ' || sum(bands_dropped) || ' bands dropped, ' || sum(bands_created) || ' created' FROM envelopes.maintenance_runs")"

# 3. A long transaction holds originator 3's band in ACCESS EXCLUSIVE mode and
# fills it to 95% (committed only when it ends, 8 seconds later).
band3=$(sql app -At -c "SELECT meta_partition::regclass FROM envelopes._bands() WHERE originator_node_id = 3")
PGAPPNAME=maintenance_test_lock "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U postgres -d app \
    -c "BEGIN" -c "LOCK TABLE $band3 IN ACCESS EXCLUSIVE MODE" \
    -c "SELECT envelopes.insert_gateway_envelopes(array_agg(3), array_agg(s::bigint), array_agg('\x01'::bytea), array_agg('\x02'::bytea)) FROM generate_series(1, 950) s" \
    -c "SELECT pg_sleep(8)" -c "COMMIT" >/dev/null 2>&1 &
holders+=($!)
holder=$!
holding() { [ "$(sql app -At -c "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'maintenance_test_lock' AND query LIKE '%pg_sleep%'")" = 1 ]; }
wait_until 10 'the locking session did not start' holding
locked=$(sql app -At -c "SELECT max(run_id) FROM envelopes.maintenance_runs")
# The bands' bounds are read with pg_get_expr, which waits for the locked band:
# the run fails there after envelopes.partition_lock_timeout.
timed_out() { [ "$(runs "WHERE run_id > $locked AND error LIKE '%lock timeout%55P03%'")" -ge 1 ]; }
wait_until 6 'no run recorded the lock timeout (runs: $(run_list))' timed_out
failed=$(sql app -At -c "SELECT run_id FROM envelopes.maintenance_runs WHERE run_id > $locked AND error IS NOT NULL ORDER BY run_id LIMIT 1")
log "run $failed recorded: $(sql app -At -c "SELECT error FROM envelopes.maintenance_runs WHERE run_id = $failed")"
[ "$(bands 3)" = 0 ] || fail "a band was created after the locked one"
grep -q 'WARNING:  pg_envelopes maintenance: .*lock timeout' "$log" || fail "the failed run is not in the server log"

# 4. The transaction commits; the next run creates the band, without error.
wait "$holder" || fail "the locking session failed"
released=$(sql app -At -c "SELECT max(run_id) FROM envelopes.maintenance_runs")
premade3() { [ "$(bands 3)" = 0,1000 ]; }
wait_until 5 'originator 3'"'"'s next band not created within two intervals of the commit (runs: $(run_list))' premade3
succeeded() { [ "$(runs "WHERE run_id > $released AND finished IS NOT NULL AND error IS NULL")" -ge 1 ]; }
wait_until 5 'no run succeeded after the lock was released (runs: $(run_list))' succeeded
log "after the commit: $(sql app -At -c "SELECT format('run %s created %s band(s), error %s', run_id, bands_created, coalesce(error, 'none')) FROM envelopes.maintenance_runs WHERE bands_created > 0 ORDER BY run_id DESC LIMIT 1")"

# 5. A restart: the launcher is back and runs go on.
as_postgres "$PG_BIN/pg_ctl" -D "$ENVELOPES_TMP/maintenance/data" -w -t 60 -m fast restart -l "$log" >/dev/null \
    || fail "the server did not restart"
restarted_at=$(sql app -At -c "SELECT pg_postmaster_start_time()")
launched() { [ "$(launcher)" = 1 ]; }
wait_until 10 'no maintenance launcher after the restart' launched
ran_since_restart() { [ "$(runs "WHERE started > '$restarted_at' AND finished IS NOT NULL")" -ge 1 ]; }
wait_until 5 'no run within two intervals of the restart (runs: $(run_list))' ran_since_restart
log "runs go on after the restart"

# 6. Off again: nothing runs.
sql app -q -c "ALTER SYSTEM SET envelopes.maintenance_interval = 0" -c "SELECT pg_reload_conf()" -o /dev/null
sleep 2
last=$(sql app -At -c "SELECT max(run_id) FROM envelopes.maintenance_runs")
insert 4 1 10 "extract(epoch FROM now()) - 3600"
sleep 3
[ "$(sql app -At -c "SELECT max(run_id) FROM envelopes.maintenance_runs")" = "$last" ] || fail "a run started after maintenance was turned off: $(run_list)"
[ "$(expired 4)" = 10 ] || fail "expired rows were deleted after maintenance was turned off"
log "off again: nothing ran"

# The postmaster never crashed: its only start times are ours, and no child
# took it down.
[ "$(sql app -At -c "SELECT pg_postmaster_start_time()")" = "$restarted_at" ] || fail "the postmaster restarted on its own"
[ "$restarted_at" != "$started_at" ] || fail "the restart did not happen"
if grep -E 'terminating any other active server processes|was terminated by signal|all server processes terminated' "$log"; then
    fail "a server process crashed"
fi
log "maintenance worker: ok"
