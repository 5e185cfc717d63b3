-- One transaction with an envelope and an outbox row, for the commit -> bus latency
-- runs (pgbench -R sets the rate).
BEGIN;
SELECT envelopes.insert_gateway_envelope(7, nextval('bench_seq'),
       '\x0123456789abcdef', '\xa5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5');
SELECT envelopes.publish('bench.events', '\x0102030405060708');
COMMIT;
