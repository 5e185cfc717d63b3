SELECT count(*) FROM bench_cursor c, envelopes.select_originator(1, c.seqs[1], 1000);
