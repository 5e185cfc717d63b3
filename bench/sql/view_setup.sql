-- The view as 0.3.0 defined it (a plain join of meta and blob), next to the
-- current one, for the view comparison.
CREATE VIEW bench_join_view AS
SELECT m.originator_node_id, m.originator_sequence_id, m.gateway_time, m.topic,
       m.payer_id, m.expiry, b.originator_envelope
  FROM envelopes.gateway_envelopes_meta m
  JOIN envelopes.gateway_envelopes_blob b
    ON b.originator_node_id = m.originator_node_id
   AND b.originator_sequence_id = m.originator_sequence_id;
