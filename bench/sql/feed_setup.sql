-- Schema for the feed comparisons, the same on the current extension and on the
-- baseline build: the extension, a shared id sequence, bands made ahead for
-- originators 1..8 so no cell creates a partition.
CREATE EXTENSION pg_envelopes;
CREATE SEQUENCE bench_seq;
SELECT envelopes.ensure_gateway_parts(n, b * 10000000 + 1, 10000000)
  FROM generate_series(1, 8) n, generate_series(0, 2) b;
