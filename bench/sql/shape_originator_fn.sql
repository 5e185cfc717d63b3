SELECT count(*), sum(pg_catalog.length(r.originator_envelope)), sum(pg_catalog.length(r.topic)), max(r.gateway_time)
  FROM envelopes.select_originator(3, 0, 1000) r;
