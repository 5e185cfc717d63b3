SELECT count(*), sum(pg_catalog.length(r.originator_envelope)), sum(pg_catalog.length(r.topic)), max(r.gateway_time)
  FROM bench_topic_cursor c, bench_ceilings l,
       envelopes.select_wave(c.topics, c.nodes, c.seqs, l.nodes, l.seqs, row_limit => 1000) r;
