SELECT count(*), sum(pg_catalog.length(r.originator_envelope)), sum(pg_catalog.length(r.topic)), max(r.gateway_time)
  FROM bench_topic_cursor c, envelopes.select_by_topic_cursors(c.topics, c.nodes, c.seqs, 100, 1000) r;
