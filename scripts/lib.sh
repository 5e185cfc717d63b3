# Shared helpers for scripts/*.sh and bench/*.sh. Source it; do not run it.
#
# Postgres refuses to run as root, so every throwaway cluster here is owned by and
# runs as the `postgres` user (initdb/pg_ctl under runuser). Clusters live under
# $ENVELOPES_TMP (default /var/tmp/pg_envelopes), one directory each, listening on
# 127.0.0.1 and on a socket inside that directory.

# The Postgres major the scripts work against: ENVELOPES_PG_MAJOR=15 (the
# default: Debian's package), 17, or 18 (built from Debian's source packages into
# ENVELOPES_PG_CACHE by scripts/postgres_build.sh; the 18 the tests use has
# assertions on). PG_BIN or PG_CONFIG, when set, name another installation.
ENVELOPES_PG_MAJOR=${ENVELOPES_PG_MAJOR:-15}
ENVELOPES_PG_CACHE=${ENVELOPES_PG_CACHE:-/var/cache/pg_envelopes}
pg_config_of() {
    case "$1" in
        15) echo /usr/lib/postgresql/15/bin/pg_config ;;
        17) echo "$ENVELOPES_PG_CACHE/pg17/bin/pg_config" ;;
        18) echo "$ENVELOPES_PG_CACHE/pg18-cassert/bin/pg_config" ;;
        *) echo "no Postgres $1 here (15, 17 or 18)" >&2; return 1 ;;
    esac
}
if [ -n "${PG_BIN:-}" ]; then
    PG_CONFIG=${PG_CONFIG:-$PG_BIN/pg_config}
else
    PG_CONFIG=${PG_CONFIG:-$(pg_config_of "$ENVELOPES_PG_MAJOR")}
    PG_BIN=$(dirname "$PG_CONFIG")
fi
# pg_regress and the isolation tester: Debian's server-dev package and a
# source build's install both keep them beside pgxs.mk.
PGXS_TEST=${PGXS_TEST:-$(dirname "$(dirname "$("$PG_CONFIG" --pgxs 2>/dev/null || echo /nonexistent/x/y)")")/test}
# The major PG_CONFIG is of ("15", "17", "18").
pg_major() { "$PG_CONFIG" --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/'; }
ENVELOPES_TMP=${ENVELOPES_TMP:-/var/tmp/pg_envelopes}
export PATH="$HOME/.cargo/bin:$PATH"

log() { printf '[%s] %s\n' "$(basename "$0")" "$*" >&2; }

as_postgres() { runuser -u postgres -- "$@"; }

# A TCP port nothing listens on right now.
# A port below the kernel's ephemeral range (32768 and up), free right now: a
# port from bind(0) lies in that range, where an outgoing connection can take it
# before the server that was meant for it binds.
free_port() {
    python3 -c '
import random, socket
for port in random.sample(range(20000, 32000), 12000):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        continue
    finally:
        s.close()
    print(port)
    break
'
}

# pick_ports COUNT LOW-HIGH: COUNT distinct ports in [LOW, HIGH], chosen at
# random among those nothing is bound to right now, one a line. Random, so that
# scripts picking ports at the same moment rarely collide (a server that still
# loses the race fails to bind and says so).
pick_ports() {
    local count=$1 range=$2
    [[ "$range" =~ ^([0-9]+)-([0-9]+)$ ]] && [ "${BASH_REMATCH[1]}" -ge 1024 ] \
        && [ "${BASH_REMATCH[1]}" -lt "${BASH_REMATCH[2]}" ] && [ "${BASH_REMATCH[2]}" -le 65535 ] \
        || { log "bad port range '$range' (want LOW-HIGH, 1024 <= LOW < HIGH <= 65535)"; return 1; }
    python3 - "$count" "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}" <<'PY'
import random, socket, sys
count, low, high = (int(a) for a in sys.argv[1:])
found = []
for port in random.sample(range(low, high + 1), high + 1 - low):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        continue
    finally:
        s.close()
    found.append(port)
    if len(found) == count:
        break
if len(found) < count:
    sys.exit(f"only {len(found)} free ports in {low}-{high}, {count} needed")
print("\n".join(map(str, found)))
PY
}

# cluster_start NAME PORT [postgresql.conf lines...]
# Creates a fresh cluster in $ENVELOPES_TMP/NAME and starts it on PORT.
cluster_start() {
    local name=$1 port=$2; shift 2
    local dir="$ENVELOPES_TMP/$name"
    cluster_stop "$name"
    rm -rf "$dir"
    install -d -o postgres -g postgres "$ENVELOPES_TMP" "$dir"
    as_postgres "$PG_BIN/initdb" -D "$dir/data" --auth=trust -U postgres -E UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 \
        || { cat "$dir/initdb.log" >&2; return 1; }
    {
        echo "listen_addresses = '127.0.0.1'"
        echo "port = $port"
        echo "unix_socket_directories = '$dir'"
        echo "max_connections = 200"
        echo "fsync = on"
        for line in "$@"; do echo "$line"; done
    } >>"$dir/data/postgresql.conf"
    # RUST_BACKTRACE=1 on purpose: the extension must keep backtraces out of
    # client errors whatever the server's environment says
    # (tests/tests/hardening.rs checks that this server has it).
    as_postgres env RUST_BACKTRACE=1 "$PG_BIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start >/dev/null \
        || { tail -n 30 "$dir/server.log" >&2; return 1; }
}

# cluster_start_standby NAME PRIMARY_PORT PORT: a streaming standby of the cluster
# on PRIMARY_PORT (a base backup with -R), in hot standby on PORT.
cluster_start_standby() {
    local name=$1 primary_port=$2 port=$3
    local dir="$ENVELOPES_TMP/$name"
    cluster_stop "$name"
    rm -rf "$dir"
    install -d -o postgres -g postgres "$ENVELOPES_TMP" "$dir"
    as_postgres "$PG_BIN/pg_basebackup" -h 127.0.0.1 -p "$primary_port" -U postgres \
        -D "$dir/data" -R -X stream >"$dir/basebackup.log" 2>&1 \
        || { cat "$dir/basebackup.log" >&2; return 1; }
    {
        echo "port = $port"
        echo "unix_socket_directories = '$dir'"
        echo "hot_standby = on"
    } >>"$dir/data/postgresql.conf"
    as_postgres env RUST_BACKTRACE=1 "$PG_BIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start >/dev/null \
        || { tail -n 30 "$dir/server.log" >&2; return 1; }
}

# cluster_enable_tls NAME: a self-signed certificate, ssl = on, and for the role
# envelopes_tls password logins over TLS only (plain connections rejected).
cluster_enable_tls() {
    local dir="$ENVELOPES_TMP/$1"
    # A throwaway CA, and a server certificate it signs (a self-signed certificate
    # is a CA certificate, which TLS clients rightly refuse as a server's).
    openssl req -new -x509 -days 2 -nodes -subj "/CN=pg_envelopes test CA" \
        -keyout "$dir/ca.key" -out "$dir/ca.crt" >/dev/null 2>&1
    openssl req -new -nodes -subj "/CN=127.0.0.1" \
        -keyout "$dir/data/server.key" -out "$dir/server.csr" >/dev/null 2>&1
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' >"$dir/server.ext"
    openssl x509 -req -days 2 -in "$dir/server.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" \
        -CAcreateserial -extfile "$dir/server.ext" -out "$dir/data/server.crt" >/dev/null 2>&1
    chown postgres:postgres "$dir/data/server.key" "$dir/data/server.crt"
    chmod 600 "$dir/data/server.key"
    {
        echo "ssl = on"
        echo "ssl_cert_file = 'server.crt'"
        echo "ssl_key_file = 'server.key'"
        echo "password_encryption = 'scram-sha-256'"
    } >>"$dir/data/postgresql.conf"
    { printf 'hostssl all envelopes_tls 127.0.0.1/32 scram-sha-256\nhost all envelopes_tls 127.0.0.1/32 reject\n'
      cat "$dir/data/pg_hba.conf"; } >"$dir/pg_hba.new"
    install -o postgres -g postgres -m 600 "$dir/pg_hba.new" "$dir/data/pg_hba.conf"
    as_postgres env RUST_BACKTRACE=1 "$PG_BIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w restart >/dev/null
}

# cluster_stop NAME: stops the cluster if it runs; leaves its files.
cluster_stop() {
    local dir="$ENVELOPES_TMP/$1"
    if [ -f "$dir/data/postmaster.pid" ]; then
        as_postgres "$PG_BIN/pg_ctl" -D "$dir/data" -m fast -w -t 60 stop >/dev/null 2>&1 \
            || as_postgres "$PG_BIN/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true
    fi
}

# Stops servers left behind by runs that were killed (our clusters, and the ones
# `cargo pgrx test` starts under $ENVELOPES_TMP/pgrx/15-<pid>), then removes them.
# Sharded stores of scripts/shards.sh are left alone unless the process that
# owned them (ENVELOPES_SHARDS_OWNER when they were started) has exited.
cleanup_leftover_clusters() {
    local pidfile dir
    for pidfile in "$ENVELOPES_TMP"/*/data/postmaster.pid "$ENVELOPES_TMP"/shards/*/data/postmaster.pid \
                   "$ENVELOPES_TMP"/pgrx/*/postmaster.pid; do
        [ -f "$pidfile" ] || continue
        dir=$(dirname "$pidfile")
        log "stopping leftover server in $dir"
        as_postgres "$PG_BIN/pg_ctl" -D "$dir" -m immediate stop >/dev/null 2>&1 || true
    done
    rm -rf "$ENVELOPES_TMP"/pgrx/15-* 2>/dev/null || true
    for dir in "$ENVELOPES_TMP"/shards.*/; do
        [ -f "$dir/owner" ] || continue
        process_alive "$(cat "$dir/owner")" && continue
        log "stopping the sharded store in ${dir%/} (its owner has exited)"
        shards_down "${dir%/}" || true
    done
}

# process_id PID: "PID STARTTIME", which names a process even after its pid is
# reused (the start time, in clock ticks after boot, is field 22 of its stat).
process_id() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    stat=${stat##*) }   # the fields after the command name (which may hold spaces)
    echo "$1 $(echo "$stat" | cut -d' ' -f20)"
}

# process_alive "PID STARTTIME": whether that process still runs.
process_alive() {
    local id
    id=$(process_id "${1%% *}") && [ "$id" = "$1" ]
}

# shards_down DIR: stops what scripts/shards.sh started in state directory DIR
# (the clusters it lists in DIR/clusters, the NATS servers in DIR/nats.pids,
# checked to be the ones serving from DIR) and removes DIR. Nothing else: a
# directory without the state marker is refused.
shards_down() {
    local dir=$1 name pid
    [ -f "$dir/.envelopes-shards" ] || { log "$dir is not a scripts/shards.sh state directory: left alone"; return 1; }
    if [ -f "$dir/nats.pids" ]; then
        while read -r pid; do
            [ -n "$pid" ] || continue
            # Only a nats-server that serves from this directory (a pid may
            # have been reused since).
            if tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "-sd $dir/nats"; then
                kill "$pid" 2>/dev/null || true
                for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
            fi
        done <"$dir/nats.pids"
    fi
    if [ -f "$dir/clusters" ]; then
        while read -r name; do
            [ -n "$name" ] || continue
            ENVELOPES_TMP=$dir cluster_stop "$name"
        done <"$dir/clusters"
    fi
    rm -rf "$dir"
}

# The servers the client integration tests (tests/) use, of the major PG_BIN is
# of, started with their connection strings exported; stop them with
# stop_integration_clusters (set that as the EXIT trap first).
INTEGRATION_CLUSTERS=(itest_standby itest noworkers fresh few_locks)
start_integration_clusters() {
    local port port_sb port_nw port_fresh port_few
    port=$(free_port)
    cluster_start itest "$port" "wal_level = logical" "max_replication_slots = 10" || return 1
    cluster_enable_tls itest || return 1
    export ENVELOPES_TEST_PG="host=127.0.0.1 port=$port user=postgres"
    export ENVELOPES_TEST_PG_CA="$ENVELOPES_TMP/itest/ca.crt"
    # A hot standby of it, for what the feed does during recovery (tests/tests/standby.rs).
    port_sb=$(free_port)
    cluster_start_standby itest_standby "$port" "$port_sb" || return 1
    export ENVELOPES_TEST_PG_STANDBY="host=127.0.0.1 port=$port_sb user=postgres"
    # A second server with no background-worker slots, for the fallback of partition
    # creation into the inserting transaction (tests/tests/worker.rs).
    port_nw=$(free_port)
    cluster_start noworkers "$port_nw" "max_worker_processes = 0" || return 1
    export ENVELOPES_TEST_PG_NO_WORKERS="host=127.0.0.1 port=$port_nw user=postgres"
    # A fresh server whose transaction counter is far behind the first one's, to
    # restore dumps into (tests/tests/restore.rs).
    port_fresh=$(free_port)
    cluster_start fresh "$port_fresh" || return 1
    export ENVELOPES_TEST_PG_FRESH="host=127.0.0.1 port=$port_fresh user=postgres"
    # A server with a small lock table, where 1,000 bands stand for 10,000 and more
    # at the default max_locks_per_transaction (tests/tests/scale.rs).
    port_few=$(free_port)
    cluster_start few_locks "$port_few" "max_locks_per_transaction = 10" "max_connections = 20" || return 1
    export ENVELOPES_TEST_PG_FEW_LOCKS="host=127.0.0.1 port=$port_few user=postgres"
    # The client programs of the same major (pg_dump in tests/tests/restore.rs).
    export PG_BIN
}
stop_integration_clusters() {
    local name
    for name in "${INTEGRATION_CLUSTERS[@]}"; do cluster_stop "$name"; done
}

# psql against a cluster started by cluster_start: cluster_psql NAME PORT DB args...
cluster_psql() {
    local name=$1 port=$2 db=$3; shift 3
    "$PG_BIN/psql" -X -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U postgres -d "$db" "$@"
}

# Release builds of the extension (install_extension release, scripts/package.sh)
# use a target directory of their own: cargo pgrx links with flags of its own
# (--no-gc-sections), and in target/ the bridge's release build and the
# extension's would each recompile the dependencies they share after the other.
EXT_TARGET=${ENVELOPES_EXT_TARGET:-$PWD/target/ext}

# Held while the system Postgres directories get pg_envelopes files (by
# install_extension, or the packages of scripts/package_test.sh), so that one
# does not land in the middle of the other.
INSTALL_LOCK=${INSTALL_LOCK:-/var/lock/pg_envelopes-install.lock}

# Builds the extension and installs it, and pg_envelopes_router, into the system
# Postgres directories.
install_extension() {
    local profile=${1:-debug}
    local flags=() env=() target=${CARGO_TARGET_DIR:-$PWD/target}
    if [ "$profile" = release ]; then
        env+=("CARGO_TARGET_DIR=$EXT_TARGET")
        target=$EXT_TARGET
    else
        flags+=(--debug)
    fi
    log "installing the extension ($profile build)"
    # Built into a package directory (which mirrors the absolute paths of
    # PG_CONFIG's installation), then, under the install lock, copied with
    # --remove-destination: each installed file is unlinked before the new one
    # is written, so the library that running backends (another test's server)
    # have mapped never changes under them (cargo pgrx install writes it in
    # place); they keep the old one until they exit. Then the install scripts of
    # released versions (so older versions can be created and upgraded; the
    # upgrade scripts in sql/ are in the package) and the router extension (pure
    # SQL, for a proxy database in front of shards). Chained with &&: a caller
    # may run this where set -e is off (install_extension || ...).
    env "${env[@]}" cargo pgrx package --pg-config "$PG_CONFIG" "${flags[@]}" >/dev/null || return 1
    (
        { flock -w 900 9 || { log "waited 15 minutes for $INSTALL_LOCK"; false; }; } \
            && cp -R --remove-destination "$target/$profile/pg_envelopes-pg$(pg_major)/." / \
            && cp sql/releases/pg_envelopes--*.sql "$("$PG_CONFIG" --sharedir)/extension/" \
            && make -s -C router install PG_CONFIG="$PG_CONFIG" >/dev/null
    ) 9>"$INSTALL_LOCK"
}
