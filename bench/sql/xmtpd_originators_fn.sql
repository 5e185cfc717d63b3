-- Every cursor originator after its position (mid-history), 1,000 rows.
SELECT count(*), sum(pg_catalog.length(r.originator_envelope)), sum(pg_catalog.length(r.topic)), max(r.gateway_time)
  FROM envelopes.select_gateway_envelopes(:nodes::int[], :seqs::bigint[], NULL, :nodes::int[], 1000) r;
