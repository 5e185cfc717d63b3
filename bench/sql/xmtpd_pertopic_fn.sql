-- Per-topic cursors: 4 topics x every originator from mid-history, 100 rows an
-- entry, 1,000 in all.
SELECT count(*), sum(pg_catalog.length(r.originator_envelope)), sum(pg_catalog.length(r.topic)), max(r.gateway_time)
  FROM envelopes.select_by_topic_cursors(:ctopics::bytea[], :cnodes::int[], :cseqs::bigint[], 100, 1000) r;
