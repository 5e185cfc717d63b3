-- In the shape of xmtpd's SelectOriginatorCeilings: a max per element.
SELECT count(*), sum(r.max_sequence_id) FROM (
    SELECT o.node, COALESCE((SELECT max(m.originator_sequence_id) FROM envelopes.gateway_envelopes_meta m
                              WHERE m.originator_node_id = o.node), 0) AS max_sequence_id
      FROM unnest(:nodes::int[]) AS o(node)) r;
