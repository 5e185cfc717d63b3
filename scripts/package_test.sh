#!/usr/bin/env bash
# The Debian packages tested as a user would use them (run by scripts/test.sh,
# last): build them (scripts/package.sh), install them with dpkg -i, and in a
# throwaway cluster
#   - CREATE EXTENSION pg_envelopes (the packaged version), insert and read;
#   - CREATE EXTENSION pg_envelopes VERSION '0.3.0' from the frozen install
#     script the package ships, write through it, ALTER EXTENSION ... UPDATE, and
#     find the row and the current version;
#   - CREATE EXTENSION pg_envelopes_router CASCADE (with PL/Proxy) in another
#     database, routing to the first: a row inserted through it is stored there;
#   - /usr/bin/envelopes-bridge --version, and egress to a JSON-lines file until
#     the rows are acknowledged: every row is in the file under its id;
# then dpkg -r them, and check that nothing dpkg -L listed is left (files, and
# directories the packages created), and purge what dpkg keeps in its database.
# The packages for Postgres 17 and 18 (whose servers are not Debian 12 packages
# here): their files in Debian's layout for that major and nothing else, their
# dependencies named for it, then the files of the extension package copied
# into the self-built tree of that major (scripts/postgres_build.sh) and the
# same CREATE EXTENSION, insert and read, 0.3.0 and ALTER EXTENSION ... UPDATE
# run from them in a cluster of that major. ENVELOPES_PG_MAJORS (default
# "15 17 18") says which majors; 15 is always tested.
#
#   scripts/package_test.sh [scripts/package.sh options: --debug, --no-build]
#
# The system Postgres directories are shared with other work on this machine
# (install_extension puts debug builds there): every pg_envelopes* and
# pg_envelopes_router* file in them, and any other file the packages would
# overwrite, is copied aside before dpkg -i and put back right after dpkg -r (and
# on any exit), each by an atomic rename. install_extension waits for the same
# lock, so no install lands in between. Skipped, with a message, where dpkg-deb
# is missing or one of the packages is already installed (not ours to remove).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

packages=(postgresql-15-pg-envelopes postgresql-15-pg-envelopes-router envelopes-bridge)
others=()
for m in ${ENVELOPES_PG_MAJORS:-15 17 18}; do
    [ "$m" = 15 ] || others+=("$m")
done
for tool in dpkg-deb dpkg; do
    command -v "$tool" >/dev/null || { log "skipped: $tool is missing (not a Debian system)"; exit 0; }
done
[ "$(id -u)" = 0 ] || { log "skipped: dpkg -i needs root"; exit 0; }
for p in "${packages[@]}"; do
    if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q ' installed$'; then
        log "skipped: $p is installed on this machine, and this test would remove it"
        exit 0
    fi
done
dpkg-query -W -f='${Status}' postgresql-15-plproxy 2>/dev/null | grep -q ' installed$' \
    || { log "postgresql-15-plproxy is not installed (scripts/setup.sh installs it)"; exit 1; }

fail() { log "FAIL: $*"; exit 1; }

debdir=$(scripts/package.sh --majors "15 ${others[*]}" "$@")
ext_version=$(cargo metadata --no-deps --format-version 1 | python3 -c '
import json, sys; print({p["name"]: p["version"] for p in json.load(sys.stdin)["packages"]}["pg_envelopes"])')
bridge_version=$(cargo metadata --no-deps --format-version 1 | python3 -c '
import json, sys; print({p["name"]: p["version"] for p in json.load(sys.stdin)["packages"]}["envelopes-bridge"])')
debs=()
for p in "${packages[@]}"; do
    f=$(ls "$debdir/${p}"_*.deb)
    [ "$(dpkg-deb -f "$f" Package)" = "$p" ] || fail "$f is not $p"
    debs+=("$f")
done
[ "$(dpkg-deb -f "${debs[0]}" Version)" = "$ext_version-1" ] || fail "extension package version $(dpkg-deb -f "${debs[0]}" Version), crate $ext_version"
[ "$(dpkg-deb -f "${debs[2]}" Version)" = "$bridge_version-1" ] || fail "bridge package version $(dpkg-deb -f "${debs[2]}" Version), crate $bridge_version"
dpkg-deb -f "${debs[1]}" Depends | grep -q 'postgresql-15-plproxy' || fail "the router package does not depend on postgresql-15-plproxy"
dpkg-deb -f "${debs[0]}" Depends | grep -q '^postgresql-15' || fail "the extension package does not depend on postgresql-15"

work="$ENVELOPES_TMP/package-test"
rm -rf "$work"
install -d -o postgres -g postgres "$ENVELOPES_TMP" "$work"
port=$(free_port)
cluster_start pkgtest "$port"
sql() { cluster_psql pkgtest "$port" "$@"; }

# --- the window: from dpkg -i to putting the saved files back ---------------

backup="$work/saved"
mkdir -p "$backup"
: >"$work/saved.list"
installed=false
# save_aside PATH: copies PATH into the backup and lists it for restore.
save_aside() {
    mkdir -p "$backup$(dirname "$1")"
    cp -a "$1" "$backup$1"
    echo "$1" >>"$work/saved.list"
}
restore() {
    local path
    [ -f "$work/saved.list" ] || return 0
    if $installed; then
        log "removing the packages (cleanup)"
        dpkg -P "${packages[@]}" >/dev/null 2>&1 || true
        installed=false
    fi
    while IFS= read -r path; do
        [ -n "$path" ] || continue
        # Put back by rename: a server that has the old library mapped keeps
        # its copy, and no reader sees half a file.
        cp -a "$backup$path" "$path.pkgtest-restore"
        mv -f "$path.pkgtest-restore" "$path"
    done <"$work/saved.list"
    : >"$work/saved.list"
}
finish() {
    restore
    cluster_stop pkgtest
    for m in "${others[@]}"; do PG_BIN=$(dirname "$(pg_config_of "$m")") cluster_stop "pkgtest$m"; done
}
trap finish EXIT
trap 'exit 130' INT TERM HUP

# The same lock as install_extension: nobody installs a build into the system
# directories while the packages' files are there.
exec 9>"$INSTALL_LOCK"
flock -w 900 9 || fail "waited 15 minutes for $INSTALL_LOCK"

sharedir=$("$PG_CONFIG" --sharedir)/extension
pkglibdir=$("$PG_CONFIG" --pkglibdir)
{
    for p in "$sharedir"/pg_envelopes* "$pkglibdir"/pg_envelopes*; do
        if [ -f "$p" ]; then echo "$p"; fi
    done
    for f in "${debs[@]}"; do dpkg-deb -c "$f" | awk '$1 !~ /^d/ { sub(/^\./, "", $6); print $6 }'; done \
        | while read -r p; do if [ -f "$p" ]; then echo "$p"; fi; done
} | sort -u >"$work/to_save"
while IFS= read -r path; do
    save_aside "$path"
done <"$work/to_save"
# Directories that exist now stay after dpkg -r; the others must go.
for f in "${debs[@]}"; do dpkg-deb -c "$f" | awk '$1 ~ /^d/ { sub(/^\./, "", $6); sub(/\/$/, "", $6); print $6 }'; done \
    | sort -u | while read -r d; do if [ -n "$d" ] && [ ! -e "$d" ]; then echo "$d"; fi; done >"$work/new_dirs"
window_start=$(date +%s.%N)
log "saved $(wc -l <"$work/saved.list") existing files; dpkg -i ${debs[*]##*/}"

installed=true
dpkg -i "${debs[@]}" >"$work/dpkg-i.log" 2>&1 || { cat "$work/dpkg-i.log" >&2; fail "dpkg -i"; }
for p in "${packages[@]}"; do
    dpkg -V "$p" >"$work/verify.log" 2>&1 || true
    [ ! -s "$work/verify.log" ] || { cat "$work/verify.log" >&2; fail "dpkg -V $p: installed files differ"; }
done

# exercise_extension: in the cluster sql() reaches, the packaged extension
# created fresh (insert, read back), and 0.3.0 created from the frozen script,
# written through, upgraded, and written through again.
exercise_extension() {
sql postgres -q -c "CREATE DATABASE fresh" -c "CREATE DATABASE upgraded" -c "CREATE DATABASE proxy"
[ "$(sql fresh -qAt -c "CREATE EXTENSION pg_envelopes" -c "SELECT extversion FROM pg_extension WHERE extname = 'pg_envelopes'")" = "$ext_version" ] \
    || fail "CREATE EXTENSION pg_envelopes did not create version $ext_version"
sql fresh -At -o /dev/null -c "SELECT envelopes.insert_gateway_envelopes('{7,7,8}', '{1,2,1}', '{\\x01,\\x01,\\x02}', '{\\xca,\\xfe,\\xba}')"
[ "$(sql fresh -At -c "SELECT count(*) FROM envelopes.gateway_envelopes_view")" = 3 ] || fail "rows inserted into the packaged extension are not read back"
sql upgraded -At -o /dev/null -c "CREATE EXTENSION pg_envelopes VERSION '0.3.0'" \
    -c "SELECT envelopes.insert_gateway_envelope(5, 1, '\\x05', '\\x0501')"
sql upgraded -At -o /dev/null -c "ALTER EXTENSION pg_envelopes UPDATE"
[ "$(sql upgraded -At -c "SELECT extversion FROM pg_extension WHERE extname = 'pg_envelopes'")" = "$ext_version" ] \
    || fail "ALTER EXTENSION pg_envelopes UPDATE from 0.3.0 did not reach $ext_version"
[ "$(sql upgraded -qAt -c "SELECT envelopes.insert_gateway_envelope(5, 2, '\\x05', '\\x0502')" \
       -c "SELECT string_agg(originator_sequence_id::text || '=' || encode(originator_envelope, 'hex'), ',' ORDER BY 1) FROM envelopes.gateway_envelopes_view")" \
   = $'1\n1=0501,2=0502' ] || fail "the row written by 0.3.0 and one written after the upgrade are not both there"
}
exercise_extension
log "pg_envelopes $ext_version created, and 0.3.0 created and upgraded to it"

# The router in another database, routing to "fresh".
sql proxy -At -o /dev/null -c "SET client_min_messages = warning" -c "CREATE EXTENSION pg_envelopes_router CASCADE" \
    -c "SELECT envelopes_router.set_shards(ARRAY['host=127.0.0.1 port=$port dbname=fresh'])"
[ "$(sql proxy -At -c "SELECT envelopes.insert_gateway_envelope(9, 1, '\\x09', '\\x0901')")" = 1 ] || fail "insert through the router"
[ "$(sql fresh -At -c "SELECT count(*) FROM envelopes.gateway_envelopes_meta WHERE originator_node_id = 9")" = 1 ] \
    || fail "the row inserted through the router is not on its shard"
log "pg_envelopes_router (with plproxy) routes to it"

# The bridge from /usr/bin.
[ "$(/usr/bin/envelopes-bridge --version)" = "envelopes-bridge $bridge_version" ] \
    || fail "/usr/bin/envelopes-bridge --version says '$(/usr/bin/envelopes-bridge --version)'"
man -l /usr/share/man/man1/envelopes-bridge.1.gz 2>/dev/null | grep -q 'egress' || fail "the man page does not render"
sql fresh -At -o /dev/null -c "SELECT envelopes.publish('orders.created', '\\x7b7d')"
/usr/bin/envelopes-bridge egress --database-url "postgres://postgres@127.0.0.1:$port/fresh" --name pkgtest --register \
    --sink "jsonl:$work/out.jsonl" >"$work/bridge.log" 2>&1 &
bridge_pid=$!
pending=""
for _ in $(seq 100); do
    pending=$(sql fresh -At -c "SELECT outbox_pending + envelopes_pending FROM envelopes.consumer_status WHERE consumer = 'pkgtest'" 2>/dev/null || true)
    [ "$pending" = 0 ] && break
    sleep 0.2
done
kill -TERM "$bridge_pid"
bridge_rc=0; wait "$bridge_pid" || bridge_rc=$?
[ "$bridge_rc" = 0 ] || { cat "$work/bridge.log" >&2; fail "the bridge exited with $bridge_rc after SIGTERM"; }
[ "$pending" = 0 ] || { cat "$work/bridge.log" >&2; fail "the bridge did not forward every row (pending: '$pending')"; }
ids=$(python3 -c '
import json, sys
print(",".join(sorted(json.loads(l)["id"] for l in open(sys.argv[1]) if l.strip())))' "$work/out.jsonl")
[ "$ids" = "7:1,7:2,8:1,9:1,outbox:1" ] || fail "the bridge wrote ids '$ids' to $work/out.jsonl"
log "envelopes-bridge $bridge_version forwarded 5 rows to a JSON-lines file"
cluster_stop pkgtest

# Remove, and look for anything left.
for p in "${packages[@]}"; do dpkg -L "$p"; done | sort -u >"$work/listed"
dpkg -r "${packages[@]}" >"$work/dpkg-r.log" 2>&1 || { cat "$work/dpkg-r.log" >&2; fail "dpkg -r"; }
installed=false
left=()
while IFS= read -r path; do
    [ -n "$path" ] && [ "$path" != /. ] || continue
    # A directory (or, with merged /usr, a symlink to one such as /lib) must go
    # only if the packages created it.
    if [ -d "$path" ]; then
        if grep -qxF "$path" "$work/new_dirs"; then left+=("$path/"); fi
    elif [ -e "$path" ] || [ -L "$path" ]; then
        left+=("$path")
    fi
done <"$work/listed"
# dpkg -r keeps a package with maintainer scripts in state config-files (its
# postrm, for a later purge); nothing of it is on disk. Purge it, so that the
# package database is as it was.
dpkg -P "${packages[@]}" >"$work/dpkg-P.log" 2>&1 || { cat "$work/dpkg-P.log" >&2; fail "dpkg -P"; }
for p in "${packages[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
    case "$status" in
        ""|*not-installed) ;;
        *) left+=("dpkg status of $p: $status") ;;
    esac
done
restore
window=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$window_start" "$(date +%s.%N)")
flock -u 9
[ "${#left[@]}" = 0 ] || fail "dpkg -r left: ${left[*]}"
log "dpkg -r left nothing of the $(wc -l <"$work/listed") paths dpkg -L listed; saved files back (system directories changed for ${window}s)"
while IFS= read -r path; do
    cmp -s "$path" "$backup$path" || fail "$path differs from the copy saved before the test"
done <"$work/to_save"

# --- Postgres 17 and 18 -----------------------------------------------------

for m in "${others[@]}"; do
    deb=$(ls "$debdir/postgresql-$m-pg-envelopes"_*.deb)
    router=$(ls "$debdir/postgresql-$m-pg-envelopes-router"_*.deb)
    [ "$(dpkg-deb -f "$deb" Version)" = "$ext_version-1" ] || fail "$deb: version $(dpkg-deb -f "$deb" Version), crate $ext_version"
    dpkg-deb -f "$deb" Depends | grep -q "^postgresql-$m," || fail "$deb does not depend on postgresql-$m"
    dpkg-deb -f "$router" Depends | grep -q "postgresql-$m-plproxy" || fail "$router does not depend on postgresql-$m-plproxy"
    # Debian's layout for this major and nothing else: no path of the tree the
    # library was compiled against, no other major's directories.
    unexpected=$(for f in "$deb" "$router"; do dpkg-deb -c "$f"; done | awk '$1 !~ /^d/ { sub(/^\./, "", $6); print $6 }' \
        | grep -v -E "^/usr/lib/postgresql/$m/lib/pg_envelopes\.so$|^/usr/share/postgresql/$m/extension/pg_envelopes(_router)?(--[0-9.]+(--[0-9.]+)?\.sql|\.control)$|^/usr/share/doc/postgresql-$m-pg-envelopes(-router)?/|^/usr/share/lintian/overrides/postgresql-$m-pg-envelopes(-router)?$" || true)
    [ -z "$unexpected" ] || fail "files outside Postgres $m's extension layout in its packages: $unexpected"
    x="$work/files$m"
    dpkg-deb -x "$deb" "$x"
    config=$(pg_config_of "$m")
    bin=$(dirname "$config")
    tree_lib=$("$config" --pkglibdir) tree_share=$("$config" --sharedir)/extension
    flock -w 900 9 || fail "waited 15 minutes for $INSTALL_LOCK"
    for p in "$tree_lib"/pg_envelopes* "$tree_share"/pg_envelopes*; do
        if [ -f "$p" ]; then save_aside "$p"; fi
    done
    # The tree keeps nothing of ours but what the package holds (a stale
    # upgrade script or library of a build would make the test pass for it).
    rm -f "$tree_lib"/pg_envelopes* "$tree_share"/pg_envelopes*
    cp "$x/usr/lib/postgresql/$m/lib/pg_envelopes.so" "$tree_lib/"
    cp "$x/usr/share/postgresql/$m/extension/"pg_envelopes* "$tree_share/"
    port=$(free_port)
    PG_BIN=$bin cluster_start "pkgtest$m" "$port"
    sql() { PG_BIN=$bin cluster_psql "pkgtest$m" "$port" "$@"; }
    exercise_extension
    [ "$(sql fresh -At -c "SHOW server_version_num" | cut -c1-2)" = "$m" ] || fail "the cluster is not Postgres $m"
    PG_BIN=$bin cluster_stop "pkgtest$m"
    # Back as it was: what install_extension put there for the other tests.
    rm -f "$tree_lib"/pg_envelopes* "$tree_share"/pg_envelopes*
    restore
    flock -u 9
    log "postgresql-$m-pg-envelopes: Debian's layout for $m; its files in Postgres $m's tree create pg_envelopes $ext_version, and 0.3.0 upgrades to it"
done

rm -rf "$work"
log "packages: ok"
