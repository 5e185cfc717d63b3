-- Cursor tables for the read-shape comparison (bench/run.sh 'shapes'), on a
-- database made by read_setup.sql: topics 0..3 of every originator from the
-- middle of its history, and its last sequence id as the wave's ceiling.
CREATE TABLE bench_topic_cursor AS
SELECT array_agg(pg_catalog.int4send(t) ORDER BY n, t) AS topics,
       array_agg(n ORDER BY n, t) AS nodes,
       array_agg(e / 2 ORDER BY n, t) AS seqs
  FROM bench_cursor c, unnest(c.nodes) AS n, generate_series(0, 3) AS t,
       LATERAL (SELECT max(s) AS e FROM unnest(c.seqs) s) m;
CREATE TABLE bench_ceilings AS
SELECT c.nodes, array_agg(m.e ORDER BY n) AS seqs
  FROM bench_cursor c, unnest(c.nodes) AS n, LATERAL (SELECT max(s) AS e FROM unnest(c.seqs) s) m
 GROUP BY c.nodes;
-- Statistics for the cursor tables: without them the planner guesses hundreds
-- of rows each, costs the reads in the millions and JIT-compiles every one.
ANALYZE bench_cursor, bench_topic_cursor, bench_ceilings;
