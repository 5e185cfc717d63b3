SELECT count(*), sum(pg_catalog.length(r.originator_envelope)), sum(pg_catalog.length(r.topic)), max(r.gateway_time)
  FROM envelopes.select_newest_by_topic(
    ARRAY[pg_catalog.int4send(0), pg_catalog.int4send(1), pg_catalog.int4send(2), pg_catalog.int4send(3)]) r;
