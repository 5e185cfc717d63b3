#!/usr/bin/env bash
# The write path's speed on each Postgres major, each against its own plain SQL
# (issue: "speed on each major"): bench/run.sh --only inorder,bulk on 15 (Debian's),
# 17 and 18 (built from Debian's source packages by scripts/postgres_build.sh;
# 18 the build without assertions, built here on first use), one after the
# other, each major's variants interleaved on its own cluster. Each run writes
# its own section of bench/RESULTS.md ("inorder,bulk" for 15, "... on
# PostgreSQL 17" and "... on PostgreSQL 18").
#   bench/majors.sh [bench/run.sh options, e.g. --durability off]
# ENVELOPES_BENCH_RUNS and ENVELOPES_BENCH_SECONDS apply to every major.
set -euo pipefail
cd "$(dirname "$0")/.."
for major in 15 17 18; do
    case "$major" in
        15) config=/usr/lib/postgresql/15/bin/pg_config ;;
        17) config=$(scripts/postgres_build.sh 17) ;;
        18) config=$(scripts/postgres_build.sh 18) ;;
    esac
    echo "[majors.sh] Postgres $major ($config)" >&2
    env -u PG_BIN ENVELOPES_PG_MAJOR=$major PG_CONFIG="$config" bench/run.sh --only inorder,bulk "$@"
done
