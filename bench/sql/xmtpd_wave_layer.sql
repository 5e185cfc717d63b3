SELECT count(*), sum(pg_catalog.length(r.originator_envelope)), sum(pg_catalog.length(r.topic)), max(r.gateway_time)
  FROM envelopes_xmtpd.select_gateway_envelopes_wave_scan(:ctopics::bytea[], :cnodes::int[], :cseqs::bigint[], :nodes::int[], :ceilings::bigint[], 0, 0, 1000) r;
