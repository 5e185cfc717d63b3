SELECT count(*), sum(pg_catalog.length(r.originator_envelope))
  FROM bench_topic_cursor c, envelopes.select_by_topic_cursors(c.topics, c.nodes, c.seqs, 100, 1000) r;
