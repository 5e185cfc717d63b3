\set node 1
\set lim 1000
SELECT count(*), sum(pg_catalog.length(r.originator_envelope)), sum(pg_catalog.length(r.topic)), max(r.gateway_time)
  FROM bench_cursor c, envelopes.select_originator(:node, c.seqs[1], :lim) r;
