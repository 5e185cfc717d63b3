-- 1,000 envelopes after a vector-clock cursor, through the extension's selector.
SELECT count(*) FROM bench_cursor c,
       envelopes.select_gateway_envelopes(c.nodes, c.seqs, row_limit => 1000);
