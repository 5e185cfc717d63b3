#!/usr/bin/env bash
# Builds the Debian packages of pg_envelopes for this machine's architecture,
# for each Postgres major M of 15, 17 and 18 (named as Debian and PGDG name
# extension packages):
#
#   postgresql-M-pg-envelopes          the extension built for M: library, control
#                                      file, the install script of this version
#                                      and of every released one (sql/releases/)
#                                      and the upgrade scripts between them, in
#                                      /usr/lib/postgresql/M/lib and
#                                      /usr/share/postgresql/M/extension
#   postgresql-M-pg-envelopes-router   pg_envelopes_router (router/), pure SQL over
#                                      PL/Proxy (postgresql-M-plproxy)
#   envelopes-bridge                   /usr/bin/envelopes-bridge, the systemd unit
#                                      envelopes-bridge@.service, an example
#                                      configuration and a man page made from --help
#
#   scripts/package.sh [--majors "15 17 18"] [--out DIR] [--debug] [--no-build] [--no-lintian]
#
# --majors defaults to ENVELOPES_PG_MAJORS, else all three. Each major's library
# is compiled against that major's headers: 15 against Debian's
# postgresql-server-dev-15, 17 and 18 against the trees scripts/postgres_build.sh
# builds from Debian's source packages (release packages for 18 against the
# build without assertions, built here on first use; --debug ones against the
# tree the tests use, which has them on). Whatever the tree's prefix, the files
# go where Debian's postgresql-M puts extensions.
#
# The extension is built with `cargo pgrx package` (release), the bridge with
# `cargo build --release`; the packages are put together with dpkg-deb (no
# debhelper, no source package) and checked with lintian, which must report no
# error and no warning; what it still says (info tags) is overridden with the
# reason in packaging/debian/*.lintian-overrides (shown as N: lines). The
# extension packages carry the extension crate's version (Cargo.toml), the
# bridge package the bridge crate's (bridge/Cargo.toml), each with Debian
# revision 1. The .deb files go to target/debian (--out), printed at the end;
# --no-build packages what the last build left. --debug packages debug builds,
# into target/debian-debug: what scripts/test.sh has built by the time it tests
# the packages (release builds from cold take a quarter of an hour here); never
# ship those.
#
# Install them with `dpkg -i` or `apt install ./FILE.deb` (apt also fetches
# postgresql-15-plproxy for the router). The Maintainer field is the last
# commit's author unless ENVELOPES_DEB_MAINTAINER="Name <address>" says otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

out="" build=true lint=true profile=release majors=${ENVELOPES_PG_MAJORS:-15 17 18}
usage="usage: $0 [--majors \"15 17 18\"] [--out DIR] [--debug] [--no-build] [--no-lintian]"
while [ $# -gt 0 ]; do
    case "$1" in
        --majors) majors=${2:?--majors needs a list such as \"15 17 18\"}; shift ;;
        --out) out=${2:?--out needs a directory}; shift ;;
        --debug) profile=debug ;;
        --no-build) build=false ;;
        --no-lintian) lint=false ;;
        *) echo "$usage" >&2; exit 2 ;;
    esac
    shift
done
[ -n "$out" ] || { [ "$profile" = release ] && out=target/debian || out=target/debian-debug; }

for tool in dpkg-deb dpkg-shlibdeps strip python3; do
    command -v "$tool" >/dev/null || { log "$tool is missing (scripts/setup.sh installs what this needs)"; exit 1; }
done
if $build && ! cargo pgrx --version >/dev/null 2>&1; then
    log "cargo-pgrx is missing: run scripts/setup.sh first"
    exit 1
fi

# Versions from the crates' manifests.
read -r ext_version bridge_version < <(cargo metadata --no-deps --format-version 1 | python3 -c '
import json, sys
v = {p["name"]: p["version"] for p in json.load(sys.stdin)["packages"]}
print(v["pg_envelopes"], v["envelopes-bridge"])')
revision=1
arch=$(dpkg --print-architecture)
# The pg_config each major's library is built with (see above).
declare -A configs=()
for m in $majors; do
    case "$m" in
        15|17) configs[$m]=$(pg_config_of "$m") ;;
        18) if [ "$profile" = release ]; then configs[$m]=$(scripts/postgres_build.sh 18); else configs[$m]=$(pg_config_of 18); fi ;;
        *) log "no packages for Postgres $m: 15, 17 or 18"; exit 2 ;;
    esac
    [ -x "${configs[$m]}" ] || { log "${configs[$m]} (Postgres $m) is missing: scripts/setup.sh builds it"; exit 1; }
    v=$("${configs[$m]}" --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')
    [ "$v" = "$m" ] || { log "${configs[$m]} is PostgreSQL $v, not $m"; exit 1; }
done
[ "${#configs[@]}" -gt 0 ] || { log "no major to package (--majors)"; exit 2; }
maintainer=${ENVELOPES_DEB_MAINTAINER:-$(git log -1 --format='%an <%ae>' 2>/dev/null || echo 'pg_envelopes maintainers <maintainers@localhost>')}
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
# Timestamps in the packages and changelogs: the last commit's, so that the same
# commit gives the same packages. Exported only after the build: ring's build
# script reruns when SOURCE_DATE_EPOCH changes, which would rebuild half the
# bridge after every commit.
source_date_epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}
changelog_date=$(date -u -R -d "@$source_date_epoch")

mkdir -p "$out"
out=$(cd "$out" && pwd)
stage="$out/build"
rm -rf "$stage"
mkdir -p "$stage"

# The extension builds where install_extension builds it: release builds in
# $EXT_TARGET (scripts/lib.sh: cargo pgrx links with flags the bridge's build
# does not have, and in one target directory each would recompile the
# dependencies they share after the other), debug builds in target/; the bridge
# where demo.sh, the tests and the benchmarks build it.
if [ "$profile" = release ]; then
    ext_target=$EXT_TARGET pgrx_flags=() cargo_flags=(--release)
else
    ext_target=$PWD/target pgrx_flags=(--debug) cargo_flags=()
fi
# pgrx_out M: where cargo pgrx package puts the build for major M (under the
# absolute paths of that major's pg_config).
pgrx_out() { echo "$ext_target/$profile/pg_envelopes-pg$1-package"; }
# cargo puts the binary under CARGO_TARGET_DIR when that is set.
bridge_bin=${CARGO_TARGET_DIR:-target}/$profile/envelopes-bridge
if $build; then
    buildlog="$out/build.log"
    : >"$buildlog"
    for m in $majors; do
        log "building the extension for Postgres $m (cargo pgrx package, $profile; log in $buildlog)"
        { rm -rf "$(pgrx_out "$m")" \
            && CARGO_TARGET_DIR=$ext_target cargo pgrx package "${pgrx_flags[@]}" --pg-config "${configs[$m]}" \
                --out-dir "$(pgrx_out "$m")"; } >>"$buildlog" 2>&1 \
            || { tail -n 40 "$buildlog" >&2; log "build failed (whole log: $buildlog)"; exit 1; }
    done
    log "building the bridge (cargo build, $profile)"
    cargo build "${cargo_flags[@]}" -p envelopes-bridge >>"$buildlog" 2>&1 \
        || { tail -n 40 "$buildlog" >&2; log "build failed (whole log: $buildlog)"; exit 1; }
fi
for m in $majors; do
    [ -f "$(pgrx_out "$m")$("${configs[$m]}" --pkglibdir)/pg_envelopes.so" ] \
        || { log "no extension for Postgres $m built in $(pgrx_out "$m") (run without --no-build)"; exit 1; }
done
[ -x "$bridge_bin" ] || { log "no $bridge_bin (run without --no-build)"; exit 1; }
export SOURCE_DATE_EPOCH=$source_date_epoch

# --- helpers ---------------------------------------------------------------

# doc_files PKG [crate]: copyright (with the Rust crates linked into PKG's
# compiled files when a crate is named) and the Debian changelog.
doc_files() {
    local pkg=$1 crate=${2:-} version=$3 root="$stage/$1"
    local doc="$root/usr/share/doc/$pkg"
    install -d "$doc"
    # The compiled files also hold the Rust crates they were built from, each
    # under its own licence: listed in the header's comment (scripts/package.sh
    # fills in @CRATES@).
    local crates=""
    if [ -n "$crate" ]; then
        # Normal dependencies only (build scripts and proc macros run at build
        # time and are not linked in), each once.
        crates=$(cargo tree -p "$crate" -e normal --prefix none --format '{p}|{l}' | python3 -c '
import re, sys
seen = set()
for line in sys.stdin:
    p, _, lic = line.rstrip("\n").partition("|")
    if "(proc-macro)" in p:
        continue
    name = re.sub(r" \(.*", "", p).strip()
    if name.split(" ")[0] == sys.argv[1] or name in seen:
        continue
    seen.add(name)
    print(" " + name + ": " + (lic.strip() or "see the crate"))
' "$crate" | LC_ALL=C sort)
        [ -n "$crates" ] || { log "cargo tree listed no crates for $crate"; exit 1; }
        crates=" .
 The compiled files also contain these Rust crates (name version: licence),
 from Cargo.lock, each under its own licence:
$crates"
    fi
    python3 -c 'import sys; sys.stdout.write(open(sys.argv[1]).read().replace("@CRATES@\n", sys.argv[2] + "\n" if sys.argv[2] else ""))' \
        packaging/debian/copyright "$crates" >"$doc/copyright"
    chmod 644 "$doc/copyright"
    printf '%s (%s-%s) unstable; urgency=medium\n\n  * Built by scripts/package.sh from git commit %s.\n\n -- %s  %s\n' \
        "$pkg" "$version" "$revision" "$commit" "$maintainer" "$changelog_date" \
        | gzip -9n >"$doc/changelog.Debian.gz"
    chmod 644 "$doc/changelog.Debian.gz"
}

# lintian_overrides PKG [MAJOR]: install packaging/debian/PKG.lintian-overrides
# if any; for a package of a Postgres major, the template named with MAJOR in
# place of the number, @MAJOR@ replaced.
lintian_overrides() {
    local f="packaging/debian/$1.lintian-overrides" dest="$stage/$1/usr/share/lintian/overrides/$1"
    if [ -n "${2:-}" ]; then
        f="packaging/debian/${1/-$2-/-MAJOR-}.lintian-overrides"
        [ -f "$f" ] || return 0
        install -d "$(dirname "$dest")"
        grep -v '^# Template:' "$f" | sed "s/@MAJOR@/$2/g" >"$dest"
        chmod 644 "$dest"
        return 0
    fi
    [ -f "$f" ] || return 0
    install -D -m 644 "$f" "$dest"
}

# shlibs_depends FILE...: the Depends that dpkg-shlibdeps computes for ELF files.
shlibs_depends() {
    local tmp
    tmp=$(mktemp -d)
    mkdir "$tmp/debian"
    printf 'Source: pg-envelopes\n\nPackage: pg-envelopes\nArchitecture: any\n' >"$tmp/debian/control"
    local files=()
    for f in "$@"; do files+=("$(readlink -f "$f")"); done
    (cd "$tmp" && dpkg-shlibdeps -O "${files[@]}" 2>/dev/null) | sed -n 's/^shlibs:Depends=//p'
    rm -rf "$tmp"
}

# finish PKG VERSION ARCH DEPENDS SECTION DESCRIPTION [EXTRA_CONTROL]: control
# file, md5sums, timestamps, permissions; builds $out/PKG_VERSION-1_ARCH.deb.
finish() {
    local pkg=$1 version=$2 pkgarch=$3 depends=$4 section=$5 description=$6 extra=${7:-}
    local root="$stage/$pkg"
    install -d "$root/DEBIAN"
    # No setuid bits or odd modes from the build: directories 755, files 644,
    # executables 755.
    find "$root" -type d -exec chmod 755 {} +
    find "$root" -type f ! -path '*/DEBIAN/*' ! -perm /111 -exec chmod 644 {} +
    find "$root" -type f ! -path '*/DEBIAN/*' -perm /111 -exec chmod 755 {} +
    (cd "$root" && find . -type f ! -path './DEBIAN/*' -printf '%P\0' | LC_ALL=C sort -z | xargs -0 -r md5sum) >"$root/DEBIAN/md5sums"
    chmod 644 "$root/DEBIAN/md5sums"
    local size
    size=$(du -k -s --exclude=DEBIAN "$root" | cut -f1)
    {
        echo "Package: $pkg"
        echo "Version: $version-$revision"
        echo "Architecture: $pkgarch"
        echo "Maintainer: $maintainer"
        echo "Installed-Size: $size"
        echo "Depends: $depends"
        [ -z "$extra" ] || printf '%s\n' "$extra"
        echo "Section: $section"
        echo "Priority: optional"
        printf 'Description: %s\n' "$description"
    } >"$root/DEBIAN/control"
    find "$root" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
    local deb="$out/${pkg}_${version}-${revision}_${pkgarch}.deb"
    rm -f "$deb"
    dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
    debs+=("$deb")
}

debs=()

# --- postgresql-M-pg-envelopes and postgresql-M-pg-envelopes-router --------

# One pass per major. The body is not indented: the package descriptions in it
# are multi-line strings whose leading spaces are Debian's control syntax.
for m in $majors; do
# Debian's postgresql-M layout, whatever prefix the tree built against has; the
# build mirrors that tree's own paths.
built="$(pgrx_out "$m")"
built_lib="$built$("${configs[$m]}" --pkglibdir)"
built_share="$built$("${configs[$m]}" --sharedir)/extension"
pkglibdir=/usr/lib/postgresql/$m/lib
sharedir=/usr/share/postgresql/$m/extension
pkg=postgresql-$m-pg-envelopes
root="$stage/$pkg"
install -d "$root$pkglibdir" "$root$sharedir"
# dh_strip's flags: symbols the server looks up (Pg_magic_func, the pg_finfo_*
# and function entry points) are dynamic and stay.
strip --remove-section=.comment --remove-section=.note --strip-unneeded \
    -o "$root$pkglibdir/pg_envelopes.so" "$built_lib/pg_envelopes.so"
chmod 644 "$root$pkglibdir/pg_envelopes.so"   # as Debian's own extension packages have them
# The control file, this version's install script and the upgrade scripts, as
# cargo pgrx package wrote them; the released install scripts, so that
# CREATE EXTENSION pg_envelopes VERSION '0.3.0' and ALTER EXTENSION ... UPDATE work.
cp "$built_share"/pg_envelopes* "$root$sharedir/"
for f in sql/releases/pg_envelopes--*.sql; do
    [ -e "$root$sharedir/$(basename "$f")" ] && { log "$(basename "$f") is both built and released"; exit 1; }
    install -m 644 "$f" "$root$sharedir/"
done
grep -q "^default_version = '$ext_version'" "$root$sharedir/pg_envelopes.control" \
    || { log "pg_envelopes.control does not say default_version = '$ext_version'"; exit 1; }
# Every released version must reach this one by upgrade scripts, or a user on it
# is stranded: walk the chain from each.
for f in sql/releases/pg_envelopes--*.sql; do
    v=$(basename "$f" .sql); v=${v#pg_envelopes--}
    while [ "$v" != "$ext_version" ]; do
        next=$(cd "$root$sharedir" && ls pg_envelopes--"$v"--*.sql 2>/dev/null | head -n 1 | sed -E 's/.*--(.*)\.sql/\1/')
        [ -n "$next" ] || { log "no upgrade script from $v towards $ext_version"; exit 1; }
        v=$next
    done
done
install -d "$root/usr/share/doc/$pkg"
gzip -9n <README.md >"$root/usr/share/doc/$pkg/README.md.gz"
doc_files "$pkg" pg_envelopes "$ext_version"
lintian_overrides "$pkg" "$m"
finish "$pkg" "$ext_version" "$arch" \
    "postgresql-$m, $(shlibs_depends "$root$pkglibdir/pg_envelopes.so")" database \
    "partitioned message-envelope store for PostgreSQL $m
 pg_envelopes stores message envelopes from many originator nodes in tables
 partitioned by originator and sequence band, and creates the partitions it
 needs on demand. It reads them back with vector-clock cursors, keeps a change
 feed in which every committed row reaches every consumer, and rings a NOTIFY
 doorbell for listeners.
 .
 This package holds the extension for PostgreSQL $m: CREATE EXTENSION
 pg_envelopes in a database. The install scripts of released versions are
 included, so older versions can be created and upgraded with
 ALTER EXTENSION pg_envelopes UPDATE."

pkg=postgresql-$m-pg-envelopes-router
root="$stage/$pkg"
install -d "$root$sharedir"
# What `make -C router install` installs (router/Makefile: EXTENSION and DATA).
install -m 644 router/pg_envelopes_router.control router/pg_envelopes_router--*.sql "$root$sharedir/"
install -d "$root/usr/share/doc/$pkg"
gzip -9n <docs/operations/scaling.md >"$root/usr/share/doc/$pkg/SCALING.md.gz"
doc_files "$pkg" "" "$ext_version"
lintian_overrides "$pkg" "$m"
finish "$pkg" "$ext_version" all "postgresql-$m, postgresql-$m-plproxy" database \
    "routes pg_envelopes calls to shards by originator (PL/Proxy)
 pg_envelopes_router is installed into a proxy database in front of several
 PostgreSQL servers that each run pg_envelopes. It defines the writer's and
 reader's functions of pg_envelopes under the same names and signatures, and
 runs each call on the shard that owns its originator (reads across shards
 are merged), so an application moves from one node to several by changing its
 connection string." \
    "Suggests: postgresql-$m-pg-envelopes"
done

# --- envelopes-bridge ------------------------------------------------------

pkg=envelopes-bridge
root="$stage/$pkg"
install -d "$root/usr/bin" "$root/lib/systemd/system" "$root/usr/share/man/man1" \
    "$root/usr/share/doc/$pkg/examples" "$root/etc/envelopes-bridge"
strip --remove-section=.comment --remove-section=.note -o "$root/usr/bin/envelopes-bridge" "$bridge_bin"
chmod 755 "$root/usr/bin/envelopes-bridge"
install -m 644 bridge/packaging/envelopes-bridge@.service "$root/lib/systemd/system/"
install -m 644 bridge/packaging/example.toml "$root/usr/share/doc/$pkg/examples/example.toml"
scripts/bridge_manpage.sh "$root/usr/bin/envelopes-bridge" "$bridge_version" "$SOURCE_DATE_EPOCH" \
    | gzip -9n >"$root/usr/share/man/man1/envelopes-bridge.1.gz"
doc_files "$pkg" envelopes-bridge "$bridge_version"
lintian_overrides "$pkg"
# Maintainer scripts as debhelper writes them for a template unit: tell systemd
# (where it runs) that the unit appeared or went; stop running instances before
# their binary is removed. Instances are enabled by the operator
# (systemctl enable --now envelopes-bridge@NAME), never by the package.
install -d "$root/DEBIAN"
cat >"$root/DEBIAN/postinst" <<'EOF'
#!/bin/sh
set -e
if [ "$1" = "configure" ] && [ -d /run/systemd/system ]; then
    systemctl --system daemon-reload >/dev/null || true
fi
EOF
cat >"$root/DEBIAN/prerm" <<'EOF'
#!/bin/sh
set -e
if [ "$1" = "remove" ] && [ -d /run/systemd/system ]; then
    deb-systemd-invoke stop 'envelopes-bridge@*.service' >/dev/null || true
fi
EOF
cat >"$root/DEBIAN/postrm" <<'EOF'
#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then
    systemctl --system daemon-reload >/dev/null || true
fi
EOF
chmod 755 "$root/DEBIAN/postinst" "$root/DEBIAN/prerm" "$root/DEBIAN/postrm"
finish "$pkg" "$bridge_version" "$arch" "$(shlibs_depends "$root/usr/bin/envelopes-bridge")" database \
    "forwards committed pg_envelopes rows to message buses and back
 envelopes-bridge reads the rows committed into a pg_envelopes database after
 its durable cursor and publishes them to NATS JetStream, Redis Streams, MQTT,
 RabbitMQ, a webhook or JSON lines, at least once with a dedup id, and
 checkpoints its cursor in the database. It also runs the other way (ingress),
 storing envelopes from a JetStream stream.
 .
 The package holds the binary, a systemd unit template (envelopes-bridge@NAME
 runs /etc/envelopes-bridge/NAME.toml) and an example configuration." \
    "Suggests: $(for m in $majors; do printf 'postgresql-%s-pg-envelopes | ' "$m"; done | sed 's/ | $//')"

rm -rf "$stage"

if $lint; then
    if command -v lintian >/dev/null; then
        log "lintian"
        # Errors and warnings fail the build; info tags are shown, and the
        # overridden tags with their reasons (O: and N: lines). Decided from the
        # output: with --show-overrides, lintian's --fail-on counts overridden
        # tags too.
        lint_out=$(lintian --display-info --show-overrides "${debs[@]}" 2>&1) \
            || { printf '%s\n' "$lint_out" >&2; log "lintian failed"; exit 1; }
        printf '%s\n' "$lint_out" | grep -v '^running with root privileges' >&2 || true
        if printf '%s\n' "$lint_out" | grep -q '^[EW]: '; then
            log "lintian found errors or warnings (E: and W: above)"
            exit 1
        fi
    else
        log "lintian is not installed (scripts/setup.sh installs it): packages not checked"
    fi
fi

for deb in "${debs[@]}"; do
    printf '%s\t%s\n' "$(du -h "$deb" | cut -f1)" "$deb" >&2
done
log "packages in $out"
echo "$out"
