#!/usr/bin/env bash
# Retention on a schedule with pg_cron, as the README describes it (run by
# scripts/test.sh). A private cluster with pg_cron preloaded
# (cron.use_background_workers, the jobs' database "app" holding pg_envelopes)
# runs envelopes.prune_expired() every interval: '5 seconds' where pg_cron takes
# seconds (1.5 and later), else every minute (Debian 12's pg_cron 1.4.2, whose
# schedules are cron lines). Checked, with bands of 1,000 ids:
#   1. expired envelopes of originator 1 are deleted, and its emptied bands
#      dropped, within two intervals of scheduling; meanwhile a long transaction
#      holding a SHARE lock on originator 2's oldest band (what CREATE INDEX
#      takes) makes the run skip that band: the run succeeds, originator 2's
#      expired rows stay;
#   2. with a reader's transaction on that band instead, the next run deletes
#      its expired rows (committed: the worker deletes and drops in transactions
#      of their own) and waits to drop the emptied band; cancelled there, the
#      run is recorded as failed in cron.job_run_details, the band stays, and
#      the schedule goes on;
#   3. once the reader has ended, a later run drops the band within two
#      intervals, and succeeds; unexpired and never-expiring rows stay
#      throughout.
# Needs the extension installed (scripts/test.sh installs it first) and
# postgresql-15-cron (scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

[ -f "$PG_BIN/../lib/pg_cron.so" ] || [ -f "$("$PG_CONFIG" --pkglibdir)/pg_cron.so" ] \
    || { log "pg_cron is not installed (apt-get install postgresql-15-cron; scripts/setup.sh does)"; exit 1; }

port=$(free_port)
cleanup() { cluster_stop cron; }
trap 'cleanup' EXIT
cluster_start cron "$port" \
    "shared_preload_libraries = 'pg_cron'" \
    "cron.database_name = 'postgres'" \
    "cron.use_background_workers = on" \
    "max_worker_processes = 16"
sql() { cluster_psql cron "$port" "$@"; }
fail() { log "FAIL: $*"; tail -n 20 "$ENVELOPES_TMP/cron/server.log" >&2; exit 1; }

sql postgres -q -c "CREATE EXTENSION pg_cron" -c "CREATE DATABASE app"
sql app -q -c "CREATE EXTENSION pg_envelopes"

# '5 seconds' where this pg_cron takes it, else once a minute.
if sql postgres -At -c "SELECT cron.unschedule(cron.schedule('probe', '5 seconds', 'SELECT 1'))" >/dev/null 2>&1; then
    schedule='5 seconds' interval=5
else
    schedule='* * * * *' interval=60
fi
log "pg_cron $(sql postgres -At -c "SELECT extversion FROM pg_extension WHERE extname = 'pg_cron'"): schedule '$schedule' (every ${interval}s)"

# Originator 1: ids 1-1500 expired (bands [0,1000) and [1000,2000) emptied and
# dropped), 2500 never expires (the newest band stays). Originator 2: 1-500
# expired, 1500 expires in an hour.
sql app -q -o /dev/null <<'SQL'
SET envelopes.band_width = 1000;
SELECT envelopes.insert_gateway_envelopes(
           array_agg(o), array_agg(s::bigint), array_agg('\x01'::bytea), array_agg('\xcafe'::bytea),
           NULL, NULL, array_agg(e))
  FROM (SELECT 1 AS o, s, extract(epoch FROM now())::bigint - 3600 AS e FROM generate_series(1, 1500) s
        UNION ALL SELECT 1, 2500, NULL
        UNION ALL SELECT 2, s, extract(epoch FROM now())::bigint - 3600 FROM generate_series(1, 500) s
        UNION ALL SELECT 2, 1500, extract(epoch FROM now())::bigint + 3600) AS rows(o, s, e);
SQL

expired() { sql app -At -c "SELECT count(*) FROM envelopes.gateway_envelopes_meta WHERE originator_node_id = $1 AND expiry < extract(epoch FROM now())"; }
bands() { sql app -At -c "SELECT string_agg(band_start::text, ',' ORDER BY band_start) FROM envelopes.partitions() WHERE originator_node_id = $1"; }
[ "$(expired 1)" = 1500 ] && [ "$(expired 2)" = 500 ] || fail "the expired rows were not inserted"

band2=$(sql app -At -c "SELECT meta_partition FROM envelopes.partitions() WHERE originator_node_id = 2 AND band_start = 0")
# hold NAME SQL: a session named NAME runs SQL in a transaction it keeps open.
holders=()
hold() {
    PGAPPNAME=$1 "$PG_BIN/psql" -X -q -h 127.0.0.1 -p "$port" -U postgres -d app \
        -c "BEGIN" -c "$2" -c "SELECT pg_sleep(3600)" >/dev/null 2>&1 &
    holders+=($!)
    for _ in $(seq 100); do
        [ "$(sql app -At -c "SELECT count(*) FROM pg_stat_activity WHERE application_name = '$1' AND query LIKE '%pg_sleep%'")" = 1 ] && return 0
        sleep 0.1
    done
    fail "session $1 did not start"
}
# release NAME: ends that session's transaction.
release() {
    sql app -At -c "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '$1'" >/dev/null
}
cleanup() {
    local p
    for p in "${holders[@]}"; do kill "$p" 2>/dev/null || true; done
    cluster_stop cron
}

# A long transaction holding a SHARE lock on originator 2's oldest band (as a
# CREATE INDEX on it would): pruning can neither delete from the band nor drop
# it, and passes it by at once.
hold cron_test_share "LOCK TABLE $band2 IN SHARE MODE"

# The schedule, in the database that holds the extension. lock_timeout_ms: how
# long a run keeps asking for the locks to drop an emptied band before it skips
# it (10 s here, so that the test can cancel a run while it waits).
job=$(sql postgres -At -c "SELECT cron.schedule_in_database('envelopes-prune', '$schedule',
        'SELECT count(*) FROM envelopes.prune_expired(lock_timeout_ms => 10000)', 'app')")
scheduled=$(date +%s)
log "job $job scheduled; waiting for originator 1's expired rows to go"

runs() { sql postgres -At -c "SELECT count(*) FROM cron.job_run_details WHERE jobid = $job AND status = '$1'"; }
run_list() { sql postgres -At -c "SELECT string_agg(status || coalesce(' (' || return_message || ')', ''), '; ' ORDER BY runid) FROM cron.job_run_details WHERE jobid = $job"; }
deadline=$((scheduled + 2 * interval + 5))
until [ "$(expired 1)" = 0 ]; do
    [ "$(date +%s)" -lt "$deadline" ] || fail "originator 1's expired rows are still there after two intervals ($(expired 1) left)"
    sleep 1
done
log "originator 1 pruned $(( $(date +%s) - scheduled ))s after scheduling"
until [ "$(runs succeeded)" -ge 1 ]; do
    [ "$(date +%s)" -lt "$((deadline + 15))" ] || fail "no run succeeded (runs: $(run_list))"
    sleep 1
done
[ "$(bands 1)" = 2000 ] || fail "originator 1 should keep only its newest band, has bands $(bands 1)"
[ "$(expired 2)" = 500 ] || fail "originator 2's band was pruned while another transaction held a SHARE lock on it ($(expired 2) expired rows left)"
[ "$(sql app -At -c "SELECT count(*) FROM envelopes.gateway_envelopes_meta WHERE expiry IS NULL OR expiry >= extract(epoch FROM now())")" = 2 ] \
    || fail "rows that have not expired were deleted"
log "run 1 succeeded and skipped the locked band (bands of originator 2: $(bands 2))"

# A reader's transaction instead (ACCESS SHARE): the next run deletes the rows,
# then waits up to 10 s to drop the emptied band. Cancelled there, the run fails
# and the band stays.
hold cron_test_reader "SELECT count(*) FROM $band2"
release cron_test_share
log "cancelling the next run while it waits to drop the band"
pid=""
deadline=$(( $(date +%s) + interval + 15 ))
while [ -z "$pid" ]; do
    [ "$(date +%s)" -lt "$deadline" ] || fail "no run waited for the band (runs: $(run_list))"
    pid=$(sql app -At -c "SELECT pid FROM pg_stat_activity WHERE query LIKE '%prune_expired(lock_timeout_ms%' AND pid <> pg_backend_pid() AND state = 'active' AND now() - query_start > interval '1 second' LIMIT 1")
    [ -n "$pid" ] || sleep 0.3
done
sql app -At -c "SELECT pg_cancel_backend($pid)" >/dev/null
deadline=$(( $(date +%s) + 15 ))
until [ "$(runs failed)" -ge 1 ]; do
    [ "$(date +%s)" -lt "$deadline" ] || fail "the cancelled run is not recorded as failed (runs: $(run_list))"
    sleep 0.5
done
log "recorded as failed: $(sql postgres -At -c "SELECT return_message FROM cron.job_run_details WHERE jobid = $job AND status = 'failed' LIMIT 1")"
[ "$(bands 2)" = 0,1000 ] || fail "the cancelled run dropped the band the reader holds (bands of originator 2: $(bands 2))"
log "the band stays ($(expired 2) of its 500 expired rows left)"

# The reader ends; a later run drops the band.
release cron_test_reader
released=$(date +%s)
deadline=$((released + 2 * interval + 5))
until [ "$(expired 2)" = 0 ]; do
    [ "$(date +%s)" -lt "$deadline" ] || fail "originator 2's expired rows are still there two intervals after the reader ended (runs: $(run_list))"
    sleep 1
done
until [ "$(bands 2)" = 1000 ]; do
    [ "$(date +%s)" -lt "$deadline" ] || fail "originator 2 should keep only its newest band, has bands $(bands 2)"
    sleep 1
done
[ "$(sql app -At -c "SELECT count(*) FROM envelopes.gateway_envelopes_meta")" = 2 ] \
    || fail "rows that have not expired were deleted"
deadline=$(( $(date +%s) + 15 ))
until [ "$(sql postgres -At -c "SELECT count(*) FROM cron.job_run_details WHERE jobid = $job AND status = 'succeeded'
        AND start_time > (SELECT max(start_time) FROM cron.job_run_details WHERE jobid = $job AND status = 'failed')")" -ge 1 ]; do
    [ "$(date +%s)" -lt "$deadline" ] || fail "no run succeeded after the failed one (runs: $(run_list))"
    sleep 0.5
done
log "originator 2 pruned $(( $(date +%s) - released ))s after the reader ended; runs: $(runs succeeded) succeeded, $(runs failed) failed"
log "pg_cron prune schedule: ok"
