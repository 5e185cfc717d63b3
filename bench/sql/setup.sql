-- Schema for the benchmarks: the extension, a shared sequence for unique ids, the
-- comparison tables, and pre-created partitions for the insert comparisons.
CREATE EXTENSION pg_envelopes;
CREATE SEQUENCE bench_seq;
-- The same layout without partitions, for the "unpartitioned" comparison.
CREATE TABLE flat_meta (LIKE envelopes.gateway_envelopes_meta INCLUDING ALL);
CREATE TABLE flat_blob (LIKE envelopes.gateway_envelopes_blob INCLUDING ALL);
-- Bands for originators 1..4 covering the ids the runs will use.
SELECT envelopes.ensure_gateway_parts(n, b * 1000000)
  FROM generate_series(1, 4) n, generate_series(0, 49) b;
