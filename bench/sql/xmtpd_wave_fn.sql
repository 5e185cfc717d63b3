-- A wave page: the per-topic entries up to every originator's ceiling, from
-- the start of the keyset, 1,000 rows.
SELECT count(*), sum(pg_catalog.length(r.originator_envelope)), sum(pg_catalog.length(r.topic)), max(r.gateway_time)
  FROM envelopes.select_wave(:ctopics::bytea[], :cnodes::int[], :cseqs::bigint[], :nodes::int[], :ceilings::bigint[], 0, 0, 1000) r;
