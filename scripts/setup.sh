#!/usr/bin/env bash
# Idempotent machine setup for pg_envelopes. Runs as root with no stdin on a fresh
# Debian 12 machine of this kind; every step is skipped when already done.
#
#   - Debian packages: Postgres 15 server + headers, clang (bindgen), sudo
#     (cargo pgrx test --runas), spin (model checks), the message buses,
#     PL/Proxy for the router extension, pg_partman for the benchmark's peer comparison (bench/run.sh fetches
#     matplotlib itself: only the benchmark plot needs it), pg_cron for the
#     retention schedule's test (scripts/cron_test.sh), and dpkg-dev and lintian
#     to build and check the Debian packages (scripts/package.sh).
#   - cargo-pgrx, the exact version the crates pin.
#   - Postgres 17 and 18 built from Debian's source packages into
#     /var/cache/pg_envelopes (scripts/postgres_build.sh; once, then cached):
#     17 as released, 18 with assertions on (--enable-cassert --enable-debug).
#     ENVELOPES_PG_MAJORS="15" skips them for a quick local setup.
#   - `cargo pgrx init` pointed at the three pg_configs, only when its config
#     lacks one of them (re-running it makes pgrx regenerate bindings and rebuild
#     everything).
#   - The message buses the bridge tests use, started when not already running.
set -euo pipefail
cd "$(dirname "$0")/.."

PGRX_VERSION=0.18.1
PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config
export DEBIAN_FRONTEND=noninteractive

log() { printf '[setup] %s\n' "$*" >&2; }

if [ "$(id -u)" != 0 ]; then
    echo "scripts/setup.sh must run as root (it installs packages)" >&2
    exit 1
fi

packages=(postgresql-15 postgresql-server-dev-15 postgresql-contrib libclang-dev clang sudo
          spin nats-server redis-server mosquitto mosquitto-clients rabbitmq-server python3
          postgresql-15-partman postgresql-15-plproxy postgresql-15-cron dpkg-dev lintian
          pgbouncer bison flex libssl-dev zlib1g-dev curl bzip2 make gcc)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
    log "installing ${missing[*]}"
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# cargo lives in ~/.cargo/bin on this kind of machine.
export PATH="$HOME/.cargo/bin:$PATH"
if ! cargo pgrx --version 2>/dev/null | grep -q " ${PGRX_VERSION}\$"; then
    # Built without optimisations (--debug, and without debug info): about 2
    # minutes rather than 7 on two cores. cargo-pgrx only drives cargo,
    # initdb and pg_ctl; the SQL schema comes from the extension's own build.
    log "installing cargo-pgrx ${PGRX_VERSION} (about 2 minutes)"
    CARGO_PROFILE_DEV_DEBUG=0 cargo install --locked --debug cargo-pgrx --version "${PGRX_VERSION}"
fi

majors=${ENVELOPES_PG_MAJORS:-15 17 18}
init=(--pg15 "$PG_CONFIG")
wanted=("pg15 = \"$PG_CONFIG\"")
for major in $majors; do
    case "$major" in
        15) continue ;;
        17) config=$(scripts/postgres_build.sh 17) ;;
        18) config=$(scripts/postgres_build.sh 18 cassert) ;;
        *) log "no Postgres $major here (15, 17, 18)"; exit 1 ;;
    esac
    init+=("--pg$major" "$config")
    wanted+=("pg$major = \"$config\"")
done
for line in "${wanted[@]}"; do
    if ! grep -qsxF "$line" "$HOME/.pgrx/config.toml"; then
        log "cargo pgrx init ${init[*]}"
        cargo pgrx init "${init[@]}"
        break
    fi
done

# Message buses for the bridge tests. Where one already answers on its default port
# it is reused; otherwise it is started here the way this machine's image starts it.
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
if ! port_open 4222; then
    log "starting nats-server with JetStream on 4222"
    install -d /var/lib/nats-server
    start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- \
        -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log
fi
if ! port_open 6379; then
    log "starting redis-server on 6379"
    install -d -o redis -g redis /var/lib/redis /var/log/redis 2>/dev/null || install -d /var/lib/redis /var/log/redis
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
        --dir /var/lib/redis --logfile /var/log/redis/ci.log
fi
if ! port_open 1883; then
    log "starting mosquitto on 1883"
    mosquitto -d -c /etc/mosquitto/mosquitto.conf
fi
if ! port_open 5672; then
    # Debian's package starts the broker where there is an init system; start it
    # here otherwise (the default guest/guest user may log in from localhost).
    log "starting rabbitmq-server on 5672"
    (rabbitmq-server >/var/log/rabbitmq-ci.log 2>&1 &)
fi
for port in 4222 6379 1883 5672; do
    for _ in $(seq 150); do port_open "$port" && break; sleep 0.2; done
    port_open "$port" || { log "nothing listens on 127.0.0.1:$port"; exit 1; }
done
log "ready"
