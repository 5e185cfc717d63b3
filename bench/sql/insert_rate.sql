-- One envelope per transaction, for the bridge latency run (pgbench -R sets the rate).
SELECT envelopes.insert_gateway_envelope(7, nextval('bench_seq'),
       '\x0123456789abcdef', '\xa5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5');
