-- Before every cell of the feed comparisons: empty tables (the late-envelope feed
-- too, where the version has one), ids from 1, a checkpoint.
TRUNCATE envelopes.gateway_envelopes_meta, envelopes.gateway_envelopes_blob;
DO $$ BEGIN
    IF pg_catalog.to_regclass('envelopes.late_envelopes') IS NOT NULL THEN
        TRUNCATE envelopes.late_envelopes;
    END IF;
END $$;
SELECT pg_catalog.setval('bench_seq', 1, false);
CHECKPOINT;
