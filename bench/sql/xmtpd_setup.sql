-- The data set of the xmtpd comparison (bench/run.sh 'xmtpd'): 20 originators x
-- 50,000 envelopes of 200 bytes on 200 topics, in bands of :width ids (run with
-- -v width=1000000 and -v width=10000), gateway times rising with the sequence.
CREATE EXTENSION IF NOT EXISTS pg_envelopes;
SELECT pg_catalog.set_config('envelopes.band_width', :'width', false);
SELECT pg_catalog.format('SELECT envelopes.insert_gateway_envelopes(
                   array_agg(%s), array_agg(s), array_agg(pg_catalog.int4send(((s * 7 + %s) %% 200)::int)),
                   array_agg(pg_catalog.convert_to(repeat(''e'', 200), ''UTF8'')), NULL,
                   array_agg(''2026-01-01 00:00:00+00''::timestamptz + s * interval ''1 millisecond''))
                 FROM generate_series(1::bigint, 50000) s', n, n)
  FROM generate_series(1, 20) n
\gexec
VACUUM ANALYZE;
