SELECT count(*) FROM envelopes.select_originator(3, 0, 1000);
