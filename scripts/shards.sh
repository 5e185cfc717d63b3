#!/usr/bin/env bash
# A sharded pg_envelopes on loopback, for tests, benchmarks and the demo.
#
#   scripts/shards.sh up N     N shard clusters (each its own Postgres server with
#                              pg_envelopes in database "envelopes"), a proxy
#                              cluster with pg_envelopes_router routing to them
#                              (16 hash partitions, or N rounded up to a power of
#                              two if more), and a three-node NATS cluster with
#                              JetStream; prints the proxy's connection string
#   scripts/shards.sh add      one more shard cluster, not in the map yet (a
#                              target for envelopes_router.move_partition);
#                              prints its connection string
#   scripts/shards.sh down     stops and removes all of it
#
# Everything lives under $ENVELOPES_TMP/shards; $ENVELOPES_TMP/shards/env holds
# the ports and connection strings (sourceable: SHARD_CONNSTRS, PROXY_CONNSTR,
# NATS_URLS, NATS_PORTS, NATS_PIDS, ...). The extensions are installed when the
# system has none yet (ENVELOPES_SHARDS_INSTALL=1 installs them anyway).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

BASE="$ENVELOPES_TMP/shards"
ENV_FILE="$BASE/env"

usage() { echo "usage: $0 up N | add | down" >&2; exit 2; }

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

# shard_start NAME PORT: a cluster with pg_envelopes in database "envelopes".
shard_start() {
    local name=$1 port=$2
    cluster_start "shards/$name" "$port" "max_locks_per_transaction = 256"
    cluster_psql "shards/$name" "$port" postgres -q -c "CREATE DATABASE envelopes"
    cluster_psql "shards/$name" "$port" envelopes -q -c "CREATE EXTENSION pg_envelopes"
}

nats_start() {
    local i=$1 port=$2 cport=$3 routes=$4
    local dir="$BASE/nats$i"
    install -d "$dir"
    setsid /usr/sbin/nats-server -a 127.0.0.1 -p "$port" -n "envelopes-nats-$i" -js -sd "$dir" \
        --cluster_name envelopes --cluster "nats://127.0.0.1:$cport" --routes "$routes" \
        -l "$dir/server.log" </dev/null >/dev/null 2>&1 &
    echo $!
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

up() {
    local n=$1 parts=16 i port shards=() ports=() connstrs=()
    [[ "$n" =~ ^[1-9][0-9]*$ ]] || usage
    while [ "$parts" -lt "$n" ]; do parts=$((parts * 2)); done
    down quiet
    install_if_needed
    install -d "$BASE"
    for i in $(seq 0 $((n - 1))); do
        port=$(free_port)
        shard_start "shard$i" "$port"
        ports+=("$port")
        connstrs+=("host=127.0.0.1 port=$port dbname=envelopes")
    done
    local proxy_port
    proxy_port=$(free_port)
    cluster_start shards/proxy "$proxy_port"
    cluster_psql shards/proxy "$proxy_port" postgres -q -c "CREATE DATABASE envelopes"
    cluster_psql shards/proxy "$proxy_port" envelopes -q -c "SET client_min_messages = warning" \
        -c "CREATE EXTENSION pg_envelopes_router CASCADE"
    local array
    array=$(printf "'%s'," "${connstrs[@]}")
    cluster_psql shards/proxy "$proxy_port" envelopes -q \
        -c "SELECT count(*) FROM envelopes_router.set_shards(ARRAY[${array%,}], $parts)" >/dev/null

    local nports=() cports=() pids=() routes
    for i in 0 1 2; do nports+=("$(free_port)"); cports+=("$(free_port)"); done
    routes="nats://127.0.0.1:${cports[0]},nats://127.0.0.1:${cports[1]},nats://127.0.0.1:${cports[2]}"
    for i in 0 1 2; do pids+=("$(nats_start "$i" "${nports[$i]}" "${cports[$i]}" "$routes")"); done
    for i in 0 1 2; do
        for _ in $(seq 100); do port_open "${nports[$i]}" && break; sleep 0.1; done
        port_open "${nports[$i]}" || { log "NATS node $i did not start"; exit 1; }
    done
    {
        echo "SHARD_COUNT=$n"
        echo "PARTITIONS=$parts"
        echo "SHARD_PORTS=(${ports[*]})"
        printf 'SHARD_CONNSTRS=('; printf '"%s" ' "${connstrs[@]}"; echo ')'
        echo "PROXY_PORT=$proxy_port"
        echo "PROXY_CONNSTR=\"host=127.0.0.1 port=$proxy_port dbname=envelopes user=postgres\""
        echo "NATS_PORTS=(${nports[*]})"
        echo "NATS_CLUSTER_PORTS=(${cports[*]})"
        echo "NATS_PIDS=(${pids[*]})"
        echo "NATS_URLS=\"nats://127.0.0.1:${nports[0]},nats://127.0.0.1:${nports[1]},nats://127.0.0.1:${nports[2]}\""
        echo "EXTRA_SHARDS=0"
    } >"$ENV_FILE"
    log "$n shards, $parts partitions, proxy on $proxy_port, NATS on ${nports[*]} (state in $ENV_FILE)"
    echo "host=127.0.0.1 port=$proxy_port dbname=envelopes user=postgres"
}

add() {
    [ -f "$ENV_FILE" ] || { log "no shards are up"; exit 1; }
    source "$ENV_FILE"
    local i=$((SHARD_COUNT + EXTRA_SHARDS)) port
    port=$(free_port)
    shard_start "shard$i" "$port"
    sed -i "s/^EXTRA_SHARDS=.*/EXTRA_SHARDS=$((EXTRA_SHARDS + 1))/" "$ENV_FILE"
    echo "EXTRA_PORT_$i=$port" >>"$ENV_FILE"
    echo "host=127.0.0.1 port=$port dbname=envelopes"
}

down() {
    local quiet=${1:-}
    if [ -f "$ENV_FILE" ]; then
        source "$ENV_FILE"
        for pid in "${NATS_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    fi
    local dir
    for dir in "$BASE"/*/; do
        [ -d "$dir/data" ] && cluster_stop "shards/$(basename "$dir")"
    done
    rm -rf "$BASE"
    [ -n "$quiet" ] || log "shards down"
}

case "${1:-}" in
    up) [ $# -eq 2 ] || usage; up "$2" ;;
    add) add ;;
    down) down ;;
    *) usage ;;
esac
