-- A parallel backfill of originator 1: each client inserts an ascending range of
-- its own (client c from c * 3,500,000), 100 rows a call, the batch number drawn
-- from one shared sequence, so the clients' ranges grow side by side and every
-- client but the one with the highest range writes rows below ids another
-- client already committed: late arrivals, 100 a call.
\set base :client_id * 3500000
-- 100 envelopes in one call of the extension's batch function.
SELECT envelopes.insert_gateway_envelopes(array_agg(1), array_agg(s),
                                          array_agg('\x0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef'::bytea), array_agg('\xa5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5'::bytea))
  FROM (SELECT :base + b.n * 100 + g AS s
          FROM (SELECT nextval('bench_seq') AS n) b, generate_series(1, 100) g) r;
