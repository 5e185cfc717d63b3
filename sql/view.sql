-- Envelopes with their bytes. Each meta row's blob row is looked up by key
-- (envelope_of, src/store/read/lookup.rs: the band from the partition cache, one primary-key
-- probe with the statement's snapshot), so a query on the view reads from blob
-- only the bands of the meta rows it returns, and a LIMIT stops both sides. A
-- meta row without its blob row is left out, as the join this view used to be
-- left it out. OFFSET 0 keeps the lookup a subquery, evaluated once per row.
CREATE VIEW gateway_envelopes_view AS
SELECT m.originator_node_id,
       m.originator_sequence_id,
       m.gateway_time,
       m.topic,
       m.payer_id,
       m.expiry,
       b.originator_envelope
  FROM gateway_envelopes_meta m
 CROSS JOIN LATERAL (
       SELECT envelope_of(m.originator_node_id, m.originator_sequence_id) AS originator_envelope
       OFFSET 0) b
 WHERE b.originator_envelope IS NOT NULL;

COMMENT ON VIEW gateway_envelopes_view IS
    'Envelopes with their bytes: each meta row with its blob row, looked up by key.';
