-- The newest envelope of 4 topics, by gateway time.
SELECT count(*), sum(pg_catalog.length(r.originator_envelope)), sum(pg_catalog.length(r.topic)), max(r.gateway_time)
  FROM envelopes.select_newest_by_topic(:topics::bytea[]) r;
