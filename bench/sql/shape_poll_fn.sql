SELECT count(*), sum(pg_catalog.length(r.originator_envelope))
  FROM bench_cursor c, envelopes.select_originator(1, c.seqs[1], 1000) r;
