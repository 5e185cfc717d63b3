-- Queries through the view touch only the bands asked for, in both tables: meta
-- is pruned by the planner, and blob is read by key for the meta rows returned
-- (envelope_of), so a sequence bound on meta decides what is read from blob too.
SET envelopes.band_width = 1000;
SELECT envelopes.insert_gateway_envelopes(array_agg(n), array_agg(s::bigint),
           array_agg('\x01'::bytea), array_agg(pg_catalog.convert_to(n || '/' || s, 'UTF8')))
  FROM generate_series(901, 903) n, generate_series(1, 3500) s;
ANALYZE envelopes.gateway_envelopes_meta, envelopes.gateway_envelopes_blob;

EXPLAIN (COSTS OFF)
SELECT * FROM envelopes.gateway_envelopes_view
 WHERE originator_node_id = 902 AND originator_sequence_id = 1500;

EXPLAIN (COSTS OFF)
SELECT * FROM envelopes.gateway_envelopes_view
 WHERE originator_node_id = 903 AND originator_sequence_id > 1500
 ORDER BY originator_sequence_id LIMIT 10;

-- A new session (its statistics start empty), one transaction: which bands the
-- reads touched, by index scans per leaf.
\c
BEGIN;
SELECT originator_node_id, originator_sequence_id, pg_catalog.convert_from(originator_envelope, 'UTF8')
  FROM envelopes.gateway_envelopes_view
 WHERE originator_node_id = 902 AND originator_sequence_id = 1500;
SELECT originator_node_id, originator_sequence_id, pg_catalog.convert_from(originator_envelope, 'UTF8')
  FROM envelopes.gateway_envelopes_view
 WHERE originator_node_id = 903 AND originator_sequence_id > 2995
 ORDER BY originator_sequence_id LIMIT 10;
SELECT relname, idx_scan FROM pg_catalog.pg_stat_xact_user_tables
 WHERE schemaname = 'envelopes' AND idx_scan > 0 ORDER BY relname;
COMMIT;

-- The view keeps its meaning: every envelope once, a meta row without its blob
-- row left out.
SELECT count(*), count(DISTINCT (originator_node_id, originator_sequence_id))
  FROM envelopes.gateway_envelopes_view WHERE originator_node_id BETWEEN 901 AND 903;
DELETE FROM envelopes.gateway_envelopes_blob WHERE originator_node_id = 901 AND originator_sequence_id = 7;
SELECT count(*) FROM envelopes.gateway_envelopes_view WHERE originator_node_id = 901;
SELECT count(*) FROM envelopes.gateway_envelopes_view WHERE originator_node_id = 901 AND originator_sequence_id = 7;

-- Reading the view needs SELECT on it and EXECUTE on envelope_of (the lookup
-- checks the view's privilege itself: calling envelope_of directly is no way
-- around it).
CREATE ROLE view_reader;
CREATE ROLE view_outsider;
SELECT envelopes.grant_reader('view_reader');
GRANT USAGE ON SCHEMA envelopes TO view_outsider;
SET ROLE view_reader;
SELECT count(*) FROM envelopes.gateway_envelopes_view WHERE originator_node_id = 902;
SELECT pg_catalog.convert_from(envelopes.envelope_of(902, 5), 'UTF8');
SET ROLE view_outsider;
SELECT envelopes.envelope_of(902, 5);
RESET ROLE;
-- envelope_of is not PUBLIC's (grant_reader grants it); granted alone, it still
-- checks that its caller may read the view or blob.
GRANT EXECUTE ON FUNCTION envelopes.envelope_of(integer, bigint) TO view_outsider;
SET ROLE view_outsider;
SELECT envelopes.envelope_of(902, 5);
RESET ROLE;
REVOKE EXECUTE ON FUNCTION envelopes.envelope_of(integer, bigint) FROM view_outsider;
SELECT envelopes.revoke_reader('view_reader');
REVOKE USAGE ON SCHEMA envelopes FROM view_outsider;
DROP OWNED BY view_reader;
DROP ROLE view_reader;
DROP ROLE view_outsider;
