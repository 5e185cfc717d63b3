-- A candidate form of gateway_envelopes_view for the view comparison: each meta
-- row looks its blob row up by key (a LATERAL primary-key probe kept from being
-- flattened by DISTINCT ON; the outer equality on the originator prunes blob at
-- plan time), so a sequence bound on meta decides what is read from blob too.
CREATE VIEW bench_lookup_view AS
SELECT m.originator_node_id, m.originator_sequence_id, m.gateway_time, m.topic,
       m.payer_id, m.expiry, b.originator_envelope
  FROM envelopes.gateway_envelopes_meta m
  JOIN LATERAL (SELECT DISTINCT ON (bl.originator_node_id) bl.originator_node_id, bl.originator_envelope
                  FROM envelopes.gateway_envelopes_blob bl
                 WHERE bl.originator_node_id = m.originator_node_id
                   AND bl.originator_sequence_id = m.originator_sequence_id) b
    ON b.originator_node_id = m.originator_node_id;
