#!/usr/bin/env bash
# scripts/shards.sh beside other things (run by scripts/test.sh):
#   - a cluster that shards.sh did not start, at the path the old shards.sh
#     removed ($ENVELOPES_TMP/shards/shard0), keeps running through every up and
#     down;
#   - two `up` at the same time, one with ports from a range of its own
#     (ENVELOPES_SHARDS_PORTS), both work: every connection string they print
#     connects as postgres from root's shell, a row inserted through each proxy
#     lands on a shard of that store, their ports and directories differ;
#   - `down` of one stops its servers and removes its directory, and the other
#     store still answers (proxy, shards, NATS); `down` of a directory that is no
#     shards.sh state is refused and leaves it.
# Everything under a private $ENVELOPES_TMP, removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

export ENVELOPES_TMP=${ENVELOPES_TMP:-/var/tmp/pg_envelopes}/shards-test
# What a killed run of this test left: its stores (owned by that run's
# process, now gone) and the bystander.
if [ -d "$ENVELOPES_TMP" ]; then
    cleanup_leftover_clusters
    cluster_stop shards/shard0
fi
rm -rf "$ENVELOPES_TMP"
install -d -o postgres -g postgres "$ENVELOPES_TMP"
export ENVELOPES_SHARDS_OWNER=$$
a="" b=""
cleanup() {
    [ -z "$a" ] || [ ! -d "$a" ] || scripts/shards.sh down "$a" 2>/dev/null || true
    [ -z "$b" ] || [ ! -d "$b" ] || scripts/shards.sh down "$b" 2>/dev/null || true
    cluster_stop shards/shard0
    rm -rf "$ENVELOPES_TMP"
}
trap cleanup EXIT

fail() { log "FAIL: $*"; exit 1; }
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# as_root_psql CONNSTR SQL: psql as root with nothing but the connection string
# (no PGUSER), as a user pasting it would.
as_root_psql() { env -u PGUSER -u PGDATABASE -u PGHOST -u PGPORT "$PG_BIN/psql" -X -At -v ON_ERROR_STOP=1 "$1" -c "$2"; }

# A bystander, where shards.sh used to keep (and wipe) everything.
bystander_port=$(free_port)
cluster_start shards/shard0 "$bystander_port"

log "two scripts/shards.sh up 1 at the same time"
range_low=21000 range_high=21999
scripts/shards.sh up 1 >"$ENVELOPES_TMP/a.out" 2>"$ENVELOPES_TMP/a.err" &
pid_a=$!
ENVELOPES_SHARDS_PORTS=$range_low-$range_high scripts/shards.sh up 1 >"$ENVELOPES_TMP/b.out" 2>"$ENVELOPES_TMP/b.err" &
pid_b=$!
wait "$pid_a" || { cat "$ENVELOPES_TMP/a.err" >&2; fail "up A failed"; }
wait "$pid_b" || { cat "$ENVELOPES_TMP/b.err" >&2; fail "up B failed"; }
a=$(cat "$ENVELOPES_TMP/a.out") b=$(cat "$ENVELOPES_TMP/b.out")
[ -f "$a/env" ] && [ -f "$b/env" ] || fail "up printed no state directories ('$a', '$b')"
[ "$a" != "$b" ] || fail "both ups printed $a"
grep -qF "state in $a" "$ENVELOPES_TMP/a.err" || fail "up A did not say where its state is"

ports_of() { (source "$1/env"; echo "${SHARD_PORTS[*]} $PROXY_PORT ${NATS_PORTS[*]} ${NATS_CLUSTER_PORTS[*]}"); }
ports_a=$(ports_of "$a") ports_b=$(ports_of "$b")
for p in $ports_b; do
    [ "$p" -ge "$range_low" ] && [ "$p" -le "$range_high" ] || fail "B's port $p is outside ENVELOPES_SHARDS_PORTS=$range_low-$range_high"
    [[ " $ports_a " != *" $p "* ]] || fail "port $p is in both stores"
done

# check_store DIR LABEL SEQ: its connection strings work as given, and a row
# (originator 7, SEQ) inserted through its proxy is on its shard.
check_store() {
    local dir=$1 label=$2 seq=$3 c n
    (
        source "$dir/env"
        for c in "${SHARD_CONNSTRS[@]}" "$PROXY_CONNSTR"; do
            [ "$(as_root_psql "$c" "SELECT current_user")" = postgres ] || fail "$label: '$c' does not connect as postgres"
        done
        n=$(as_root_psql "$PROXY_CONNSTR" "SELECT envelopes.insert_gateway_envelope(7, $seq, '\\x01', '\\xcafe')")
        [ "$n" = 1 ] || fail "$label: insert through the proxy returned '$n'"
        n=$(as_root_psql "${SHARD_CONNSTRS[0]}" "SELECT count(*) FROM envelopes.gateway_envelopes_meta WHERE (originator_node_id, originator_sequence_id) = (7, $seq)")
        [ "$n" = 1 ] || fail "$label: the row is not on the shard"
        for p in "${NATS_PORTS[@]}"; do port_open "$p" || fail "$label: NATS on $p does not answer"; done
    )
}
check_store "$a" A 1
check_store "$b" B 1
last=$(cat "$ENVELOPES_TMP/shards.last")
log "both stores work (ports A: $ports_a; B: $ports_b)"

log "scripts/shards.sh down A"
a_ports=$ports_a
scripts/shards.sh down "$a" 2>/dev/null
[ ! -e "$a" ] || fail "down left $a"
for p in $a_ports; do ! port_open "$p" || fail "A's port $p still answers after down"; done
check_store "$b" B 2
[ "$(cluster_psql shards/shard0 "$bystander_port" postgres -At -c 'SELECT 1')" = 1 ] || fail "the bystander cluster stopped"
log "B and the bystander still run after A went down"

notstate="$ENVELOPES_TMP/not-shards"
install -d "$notstate/shard0/data"
if scripts/shards.sh down "$notstate" 2>/dev/null; then fail "down accepted a directory shards.sh did not make"; fi
[ -d "$notstate/shard0/data" ] || fail "down removed a directory shards.sh did not make"

# Without DIR, down takes the last up recorded, or none once that one is down.
if [ "$last" = "$a" ]; then
    [ ! -e "$ENVELOPES_TMP/shards.last" ] || fail "shards.last still names A after its down"
    if scripts/shards.sh down 2>/dev/null; then fail "down without DIR ran with no up recorded"; fi
    scripts/shards.sh down "$b" 2>/dev/null
else
    [ "$last" = "$b" ] || fail "shards.last names neither store ('$last')"
    log "scripts/shards.sh down (the last up, B)"
    scripts/shards.sh down 2>/dev/null
fi
[ ! -e "$b" ] || fail "down left $b"
[ "$(cluster_psql shards/shard0 "$bystander_port" postgres -At -c 'SELECT 1')" = 1 ] || fail "the bystander cluster stopped"
log "shards.sh: side by side, each down stops only its own: ok"
