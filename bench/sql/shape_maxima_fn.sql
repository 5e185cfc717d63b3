SELECT count(*), sum(r.max_sequence_id)
  FROM bench_cursor c, envelopes.originator_maxima(c.nodes) r;
