-- Schema for the benchmarks: the extension, a shared sequence for unique ids, the
-- comparison tables, and pre-created partitions for the insert comparisons.
CREATE EXTENSION pg_envelopes;
CREATE SEQUENCE bench_seq;
-- The same layout without partitions, for the "unpartitioned" comparison.
CREATE TABLE flat_meta (LIKE envelopes.gateway_envelopes_meta INCLUDING ALL);
CREATE TABLE flat_blob (LIKE envelopes.gateway_envelopes_blob INCLUDING ALL);
-- Bands for originators 1..8 (the in-order cells give each of up to 8 clients its
-- own) covering the ids the runs will use: bench/sql/reset.sql
-- restarts the shared sequence before every cell, and one cell of 100-row batches
-- stays well below 30 million ids, so no variant ever creates a partition.
SELECT envelopes.ensure_gateway_parts(n, b * 10000000 + 1, 10000000)
  FROM generate_series(1, 8) n, generate_series(0, 2) b;
