#!/usr/bin/env bash
# A sharded pg_envelopes on loopback, for tests, benchmarks and the demo. Safe to
# run beside anything: every `up` gets a state directory of its own, and `down`
# stops only what that `up` started.
#
#   scripts/shards.sh up N [DIR]   N shard clusters (each its own Postgres server
#                                  with pg_envelopes in database "envelopes"), a
#                                  proxy cluster with pg_envelopes_router routing
#                                  to them (16 hash partitions, or N rounded up to
#                                  a power of two if more), and a three-node NATS
#                                  cluster with JetStream. State in DIR (default: a
#                                  new $ENVELOPES_TMP/shards.XXXXXX; a DIR given
#                                  must not exist yet or be empty); prints DIR
#   scripts/shards.sh add [DIR]    one more shard cluster, not in the map yet (a
#                                  target for envelopes_router.move_partition);
#                                  prints its connection string
#   scripts/shards.sh down [DIR]   stops what that `up` started and removes DIR
#
# Without DIR, `add` and `down` take the last `up` started under this
# $ENVELOPES_TMP (recorded in $ENVELOPES_TMP/shards.last).
#
# DIR/env holds the ports and connection strings (sourceable: SHARD_CONNSTRS,
# PROXY_CONNSTR, SHARD_PORTS, PROXY_PORT, NATS_URLS, NATS_PORTS, ...); every
# connection string names user=postgres (the clusters' superuser). The router's
# map in the proxy names no user: PL/Proxy connects to a shard as the calling role.
#
# Ports: chosen at random among the free ones in ENVELOPES_SHARDS_PORTS (LOW-HIGH,
# default 20000-32000: below Linux's ephemeral range, 32768 and up, where an
# outgoing connection could take a port before its server binds it). A server
# that loses a port to a concurrent script is started again on another.
#
# ENVELOPES_SHARDS_OWNER=PID ties the store to a process: once that process has
# exited, cleanup_leftover_clusters (scripts/lib.sh, run by scripts/test.sh)
# stops and removes it. Without it, only `down` does. The extensions are
# installed into the system Postgres when it has none yet
# (ENVELOPES_SHARDS_INSTALL=1 installs them anyway).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

PORTS=${ENVELOPES_SHARDS_PORTS:-20000-32000}
LAST="$ENVELOPES_TMP/shards.last"

usage() { echo "usage: $0 up N [DIR] | add [DIR] | down [DIR]" >&2; exit 2; }

install_if_needed() {
    local share
    share=$("$PG_CONFIG" --sharedir)/extension
    if [ "${ENVELOPES_SHARDS_INSTALL:-0}" = 1 ] || [ ! -f "$share/pg_envelopes.control" ]; then
        install_extension debug
    fi
    if [ "${ENVELOPES_SHARDS_INSTALL:-0}" = 1 ] || [ ! -f "$share/pg_envelopes_router.control" ] \
        || ! cmp -s router/pg_envelopes_router--0.1.0.sql "$share/pg_envelopes_router--0.1.0.sql"; then
        make -s -C router install PG_CONFIG="$PG_CONFIG" >/dev/null
    fi
}

# state_dir [DIR]: DIR, or the last `up`'s.
state_dir() {
    local dir=${1:-}
    if [ -z "$dir" ]; then
        [ -f "$LAST" ] || { log "no DIR given and no shards.sh up recorded in $LAST"; exit 1; }
        dir=$(cat "$LAST")
    fi
    [ -d "$dir" ] || { log "$dir does not exist (already down?)"; exit 1; }
    (cd "$dir" && pwd)
}

# cluster NAME PORT [conf lines]: a cluster in $STATE/NAME, recorded in
# $STATE/clusters before it starts (so `down` finds it whatever happens next);
# on a port taken meanwhile, tried again on another. Sets $started_port.
cluster() {
    local name=$1 port=$2 try; shift 2
    grep -qx "$name" "$STATE/clusters" 2>/dev/null || echo "$name" >>"$STATE/clusters"
    for try in 1 2 3; do
        if ENVELOPES_TMP=$STATE cluster_start "$name" "$port" "$@" 2>"$STATE/$name.err"; then
            started_port=$port
            return 0
        fi
        grep -q "could not bind\|Address already in use" "$STATE/$name/server.log" 2>/dev/null \
            || { cat "$STATE/$name.err" >&2; return 1; }
        log "port $port was taken meanwhile; $name tries another"
        port=$(pick_ports 1 "$PORTS")
    done
    cat "$STATE/$name.err" >&2
    return 1
}

psql_in() { ENVELOPES_TMP=$STATE cluster_psql "$@"; }

# shard_start NAME PORT: a cluster with pg_envelopes in database "envelopes".
shard_start() {
    cluster "$1" "$2" "max_locks_per_transaction = 256"
    psql_in "$1" "$started_port" postgres -q -c "CREATE DATABASE envelopes"
    psql_in "$1" "$started_port" envelopes -q -c "CREATE EXTENSION pg_envelopes"
}

nats_start() {
    local i=$1 port=$2 cport=$3 routes=$4
    local dir="$STATE/nats$i"
    install -d "$dir"
    setsid /usr/sbin/nats-server -a 127.0.0.1 -p "$port" -n "envelopes-nats-$i-$$" -js -sd "$dir" \
        --cluster_name envelopes --cluster "nats://127.0.0.1:$cport" --routes "$routes" \
        -l "$dir/server.log" </dev/null >/dev/null 2>&1 &
    echo $! >>"$STATE/nats.pids"
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

up() {
    local n=$1 dir=${2:-} parts=16 i ports=() connstrs=() map=()
    [[ "$n" =~ ^[1-9][0-9]*$ ]] || usage
    while [ "$parts" -lt "$n" ]; do parts=$((parts * 2)); done
    pick_ports 1 "$PORTS" >/dev/null   # a bad range fails here, before anything starts
    install -d -o postgres -g postgres "$ENVELOPES_TMP"
    if [ -n "$dir" ]; then
        if [ -e "$dir" ] && [ -n "$(ls -A "$dir")" ]; then
            log "$dir exists and is not empty: give a new directory (or none)"
            exit 1
        fi
        install -d "$dir"
    else
        dir=$(mktemp -d "$ENVELOPES_TMP/shards.XXXXXX")
    fi
    STATE=$(cd "$dir" && pwd)
    chmod 755 "$STATE"   # the clusters' postgres user must reach its data directories
    touch "$STATE/.envelopes-shards"
    echo "$STATE" >"$LAST"
    if [ -n "${ENVELOPES_SHARDS_OWNER:-}" ]; then
        process_id "$ENVELOPES_SHARDS_OWNER" >"$STATE/owner" \
            || { log "ENVELOPES_SHARDS_OWNER=$ENVELOPES_SHARDS_OWNER is no running process"; exit 1; }
    fi
    # A failed `up` takes down what it had started.
    trap 'log "up failed: stopping what it started in $STATE"; shards_down "$STATE" || true' EXIT
    install_if_needed

    mapfile -t ports < <(pick_ports $((n + 1 + 6)) "$PORTS")
    [ "${#ports[@]}" -eq $((n + 1 + 6)) ] || { log "not enough free ports in $PORTS"; exit 1; }
    for i in $(seq 0 $((n - 1))); do
        shard_start "shard$i" "${ports[$i]}"
        ports[i]=$started_port
        connstrs+=("host=127.0.0.1 port=$started_port dbname=envelopes user=postgres")
        map+=("host=127.0.0.1 port=$started_port dbname=envelopes")
    done
    local proxy_port=${ports[$n]}
    cluster proxy "$proxy_port"
    proxy_port=$started_port
    psql_in proxy "$proxy_port" postgres -q -c "CREATE DATABASE envelopes"
    psql_in proxy "$proxy_port" envelopes -q -c "SET client_min_messages = warning" \
        -c "CREATE EXTENSION pg_envelopes_router CASCADE"
    local array
    array=$(printf "'%s'," "${map[@]}")
    psql_in proxy "$proxy_port" envelopes -q \
        -c "SELECT count(*) FROM envelopes_router.set_shards(ARRAY[${array%,}], $parts)" >/dev/null

    local nports=("${ports[@]:$((n + 1)):3}") cports=("${ports[@]:$((n + 4)):3}") routes
    routes="nats://127.0.0.1:${cports[0]},nats://127.0.0.1:${cports[1]},nats://127.0.0.1:${cports[2]}"
    for i in 0 1 2; do nats_start "$i" "${nports[$i]}" "${cports[$i]}" "$routes"; done
    for i in 0 1 2; do
        for _ in $(seq 100); do port_open "${nports[$i]}" && break; sleep 0.1; done
        port_open "${nports[$i]}" || { log "NATS node $i did not start (port ${nports[$i]}; $STATE/nats$i/server.log)"; exit 1; }
    done
    local pids
    mapfile -t pids <"$STATE/nats.pids"
    {
        echo "STATE_DIR=\"$STATE\""
        echo "SHARD_COUNT=$n"
        echo "PARTITIONS=$parts"
        echo "SHARD_PORTS=(${ports[*]:0:$n})"
        printf 'SHARD_CONNSTRS=('; printf '"%s" ' "${connstrs[@]}"; echo ')'
        echo "PROXY_PORT=$proxy_port"
        echo "PROXY_CONNSTR=\"host=127.0.0.1 port=$proxy_port dbname=envelopes user=postgres\""
        echo "NATS_PORTS=(${nports[*]})"
        echo "NATS_CLUSTER_PORTS=(${cports[*]})"
        echo "NATS_PIDS=(${pids[*]})"
        echo "NATS_URLS=\"nats://127.0.0.1:${nports[0]},nats://127.0.0.1:${nports[1]},nats://127.0.0.1:${nports[2]}\""
        echo "EXTRA_SHARDS=0"
    } >"$STATE/env"
    trap - EXIT
    log "$n shards, $parts partitions; proxy: host=127.0.0.1 port=$proxy_port dbname=envelopes user=postgres"
    log "NATS on ${nports[*]}; state in $STATE (source $STATE/env; stop with: scripts/shards.sh down $STATE)"
    echo "$STATE"
}

add() {
    STATE=$(state_dir "${1:-}")
    [ -f "$STATE/env" ] || { log "$STATE has no env file: its up did not finish"; exit 1; }
    source "$STATE/env"
    local i=$((SHARD_COUNT + EXTRA_SHARDS))
    shard_start "shard$i" "$(pick_ports 1 "$PORTS")"
    sed -i "s/^EXTRA_SHARDS=.*/EXTRA_SHARDS=$((EXTRA_SHARDS + 1))/" "$STATE/env"
    echo "EXTRA_PORT_$i=$started_port" >>"$STATE/env"
    log "spare shard $i on port $started_port (not in the router's map)"
    echo "host=127.0.0.1 port=$started_port dbname=envelopes user=postgres"
}

down() {
    local dir
    dir=$(state_dir "${1:-}")
    shards_down "$dir"
    if [ -f "$LAST" ] && [ "$(cat "$LAST")" = "$dir" ]; then rm -f "$LAST"; fi
    log "shards in $dir down"
}

case "${1:-}" in
    up) [ $# -ge 2 ] && [ $# -le 3 ] || usage; up "$2" "${3:-}" ;;
    add) [ $# -le 2 ] || usage; add "${2:-}" ;;
    down) [ $# -le 2 ] || usage; down "${2:-}" ;;
    *) usage ;;
esac
