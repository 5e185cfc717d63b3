-- Run before every cell of the insert, batch and notify comparisons (after the
-- pg_partman tables are emptied, where bench/sql/setup_partman.sql made them):
-- each variant starts on empty tables and the same ids, and the cluster's disk
-- use stays at one cell's rows (a full run would otherwise write tens of GB).
TRUNCATE envelopes.gateway_envelopes_meta, envelopes.gateway_envelopes_blob, envelopes.late_envelopes,
         flat_meta, flat_blob;
SELECT pg_catalog.setval('bench_seq', 1, false);
CHECKPOINT;
