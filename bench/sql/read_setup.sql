-- A read benchmark database: :nodes originators x :bands band partitions of 100 ids,
-- each band full. The cursor stands at the end of every originator except node 3,
-- which is read from 0: a 1,000-row read then spans ten bands of one originator,
-- the same rows in every database, whatever the number of partitions around them.
CREATE EXTENSION pg_envelopes;
SET envelopes.band_width = 100;
-- One originator per transaction: creating all bands at once would need more
-- locks than the lock table has.
SELECT format('SELECT envelopes.insert_gateway_envelopes(
                   array_agg(%s), array_agg(s), array_agg(pg_catalog.int4send(s::int %% 16)),
                   array_agg(pg_catalog.convert_to(repeat(''e'', 200), ''UTF8'')))
                 FROM generate_series(1::bigint, %s) s', n, :bands * 100 - 1)
  FROM generate_series(1, :nodes) n
\gexec
VACUUM ANALYZE;
CREATE TABLE bench_cursor AS
SELECT array_agg(n ORDER BY n) AS nodes,
       array_agg(CASE WHEN n = 3 THEN 0 ELSE :bands * 100 - 1 END::bigint ORDER BY n) AS seqs
  FROM generate_series(1, :nodes) n;
SELECT count(*) AS leaf_partitions FROM envelopes.partitions();
