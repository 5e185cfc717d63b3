#!/usr/bin/env bash
# Builds pg_envelopes as of git REF (release build) into a relocated copy of the
# Postgres 15 installation under DIR, so that a cluster started from DIR's
# binaries runs that version of the extension while another cluster runs the
# current one: bench/run.sh compares them side by side in one run.
#
# Postgres finds its lib and share directories relative to its binaries, so a
# copied tree is a complete installation of its own.
#
# usage: bench/baseline.sh REF DIR     (prints DIR's bin directory)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
ref=${1:?usage: bench/baseline.sh REF DIR}
dir=${2:?usage: bench/baseline.sh REF DIR}
commit=$(git rev-parse --verify "$ref^{commit}")

if [ -f "$dir/built-from" ] && [ "$(cat "$dir/built-from")" = "$commit" ]; then
    echo "$dir/usr/lib/postgresql/15/bin"
    exit 0
fi
rm -rf "$dir"
mkdir -p "$dir/src" "$dir/usr/lib/postgresql" "$dir/usr/share/postgresql"
git archive "$commit" | tar -x -C "$dir/src"
cp -a "$(dirname "$PG_BIN")" "$dir/usr/lib/postgresql/"
cp -a "$("$PG_CONFIG" --sharedir)" "$dir/usr/share/postgresql/"
log "building pg_envelopes at ${commit:0:12} (release) for the baseline"
# Its own target directory, so the current build stays incremental.
(cd "$dir/src" && CARGO_TARGET_DIR="$ENVELOPES_TMP/baseline-target" \
    cargo pgrx package --pg-config "$PG_CONFIG" --out-dir "$dir/package" >/dev/null)
pkg="$dir/package/usr"
rm -f "$dir"/usr/share/postgresql/15/extension/pg_envelopes* "$dir"/usr/lib/postgresql/15/lib/pg_envelopes.so
cp "$pkg"/lib/postgresql/15/lib/pg_envelopes.so "$dir/usr/lib/postgresql/15/lib/"
cp "$pkg"/share/postgresql/15/extension/pg_envelopes* "$dir/usr/share/postgresql/15/extension/"
cp "$dir/src"/sql/releases/pg_envelopes--*.sql "$dir/usr/share/postgresql/15/extension/" 2>/dev/null || true
echo "$commit" >"$dir/built-from"
echo "$dir/usr/lib/postgresql/15/bin"
