SELECT count(*) FROM bench_cursor c, envelopes.originator_maxima(c.nodes);
