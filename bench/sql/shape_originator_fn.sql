SELECT count(*), sum(pg_catalog.length(r.originator_envelope))
  FROM envelopes.select_originator(3, 0, 1000) r;
