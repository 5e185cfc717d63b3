SELECT count(*), sum(pg_catalog.length(r.originator_envelope)), sum(pg_catalog.length(r.topic)), max(r.gateway_time)
  FROM bench_cursor c, envelopes.select_originator(1, c.seqs[1], 1000) r;
