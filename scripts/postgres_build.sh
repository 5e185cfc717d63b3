#!/usr/bin/env bash
# Builds Postgres 17 or 18 (or 15.18, see below) from Debian's source package
# into a cache, once:
#   scripts/postgres_build.sh 15|17|18 [cassert]
# prints the pg_config of the result. Debian 12 packages only Postgres 15; the
# orig tarballs of Debian's own postgresql-17 (trixie) and postgresql-18 (sid)
# source packages are fetched from the Debian archive by URL (the pool), checked
# against the sha256 their .dsc names (pinned here), configured with
# --prefix=<cache>/pg<N>[-cassert] and built with what pgrx and the tests use:
# the server, its headers, the client programs, and the contrib modules amcheck,
# pageinspect, dblink, postgres_fdw and test_decoding, and the isolation tester. `cassert` adds
# --enable-cassert --enable-debug (assertions on: the check that the direct heap
# and index writes, shared memory and workers use Postgres as it does itself).
# A second run finds the marker file and only prints the path.
set -euo pipefail
major=${1:?usage: postgres_build.sh 15|17|18 [cassert]}
flavour=${2:-}
cache=${ENVELOPES_PG_CACHE:-/var/cache/pg_envelopes}
archive=${ENVELOPES_DEBIAN_ARCHIVE:-http://deb.debian.org/debian}

case "$major" in
    # 15.18 (bookworm's own source package): the old side of the pg_upgrade
    # test. Debian's 15.20 package stamps every column with an attribute option
    # (pg_attver) that the 17 and 18 releases reachable here do not know, so
    # pg_upgrade from it fails for any table; a 15 from before that release
    # upgrades as a user's 15 does to the matching 17 and 18 minors.
    15) version=15.18; sha=11df0df97fe3ea4ba9a791faaf39cee1d2fe571e78885b5b55d8517d27c323b4 ;;
    17) version=17.11; sha=dd27f2b3c59e73ed14aa3324901242bf69a032a6347805f274e6260322d42979 ;;
    18) version=18.6; sha=555610c24d53e4316da5b7d3fc25c279d96856d5e0e23ee308c328c5fa881d9f ;;
    *) echo "postgres_build.sh: major $major is not built here (15, 17 or 18)" >&2; exit 64 ;;
esac
options=(--without-icu --with-openssl --without-readline)
# The 15.18 is only the old side of the pg_upgrade test: built without
# optimisation it takes about half the time, and speed does not matter there.
if [ "$major" = 15 ]; then options+=(CFLAGS=-O0); fi
name=pg$major
if [ "$flavour" = cassert ]; then
    options+=(--enable-cassert --enable-debug)
    name=$name-cassert
elif [ -n "$flavour" ]; then
    echo "postgres_build.sh: unknown flavour $flavour (only cassert)" >&2; exit 64
fi
prefix=$cache/$name
marker="$prefix/.built-2-$version-$(printf '%s ' "${options[@]}" | sha256sum | cut -c1-12)"
if [ -e "$marker" ]; then
    echo "$prefix/bin/pg_config"
    exit 0
fi

for tool in bison flex make gcc; do
    command -v "$tool" >/dev/null || { echo "postgres_build.sh: $tool is missing (scripts/setup.sh installs it)" >&2; exit 69; }
done
mkdir -p "$cache/src"
tarball=$cache/src/postgresql-${major}_$version.orig.tar.bz2
if ! echo "$sha  $tarball" | sha256sum --quiet -c - >/dev/null 2>&1; then
    url=$archive/pool/main/p/postgresql-$major/postgresql-${major}_$version.orig.tar.bz2
    echo "postgres_build.sh: fetching $url" >&2
    curl -fsSL --retry 3 -o "$tarball.part" "$url"
    mv "$tarball.part" "$tarball"
    echo "$sha  $tarball" | sha256sum --quiet -c - \
        || { echo "postgres_build.sh: $tarball does not match the pinned sha256" >&2; rm -f "$tarball"; exit 65; }
fi
work=$(mktemp -d "$cache/src/build-$name.XXXXXX")
trap 'rm -rf "$work"' EXIT
trap 'exit 143' TERM INT
tar -xjf "$tarball" -C "$work"
cd "$work/postgresql-$version"
started=$(date +%s)
echo "postgres_build.sh: building Postgres $version ($name) into $prefix" >&2
rm -rf "$prefix"
./configure --prefix="$prefix" "${options[@]}" >"$work/configure.log" 2>&1 \
    || { tail -30 "$work/configure.log" >&2; exit 1; }
jobs=$(nproc)
{
    make -j"$jobs" -s
    make -s install
    for module in amcheck pageinspect dblink postgres_fdw test_decoding; do
        make -C "contrib/$module" -j"$jobs" -s install
    done
    # pg_isolation_regress and isolationtester, for the isolation specs (a
    # plain install leaves them out; Debian's server-dev package has them).
    make -C src/test/isolation -j"$jobs" -s install
} >"$work/build.log" 2>&1 || { tail -40 "$work/build.log" >&2; exit 1; }
# The server runs as postgres; the tree stays root's, readable by all.
chmod -R a+rX "$prefix"
touch "$marker"
echo "postgres_build.sh: Postgres $version ($name) built in $(( $(date +%s) - started )) s" >&2
echo "$prefix/bin/pg_config"
