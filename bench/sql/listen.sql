-- A listener that keeps draining the doorbell, so notifications flow as they would
-- with a bridge attached.
LISTEN envelopes;
SELECT pg_sleep(0.01);
