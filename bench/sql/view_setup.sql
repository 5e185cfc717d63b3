-- The form gateway_envelopes_view had before 0.4.0, for the view comparison: meta
-- joined with blob on the key. The planner carries the originator's equality to
-- blob but not a sequence range, so blob is read over all of the originator's
-- bands; the view now looks each meta row's bytes up by key (src/store/read/lookup.rs).
CREATE VIEW bench_join_view AS
SELECT m.originator_node_id, m.originator_sequence_id, m.gateway_time, m.topic,
       m.payer_id, m.expiry, b.originator_envelope
  FROM envelopes.gateway_envelopes_meta m
  JOIN envelopes.gateway_envelopes_blob b
    ON b.originator_node_id = m.originator_node_id
   AND b.originator_sequence_id = m.originator_sequence_id;
