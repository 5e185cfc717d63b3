SELECT count(*), sum(pg_catalog.length(r.originator_envelope)), sum(pg_catalog.length(r.topic)), max(r.gateway_time)
  FROM envelopes_xmtpd.select_gateway_envelopes_by_topics(:nodes::int[], :seqs::bigint[], :topics::bytea[], 1000) r;
