-- One envelope per transaction that the benchmark's private bus refuses (over its
-- size limit): originator 1, :size bytes (pgbench -D size=...; -R sets the rate).
SELECT envelopes.insert_gateway_envelope(1, nextval('poison_seq'), '\x01',
       pg_catalog.decode(pg_catalog.repeat('ab', :size), 'hex'));
