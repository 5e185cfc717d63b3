-- In the shape of xmtpd's SelectGatewayEnvelopesUnfiltered: the joined tables
-- left-joined with the cursor, after each position (0 without one).
SELECT count(*), sum(pg_catalog.length(r.originator_envelope)), sum(pg_catalog.length(r.topic)), max(r.gateway_time) FROM (
    WITH c AS (
        SELECT n.node, s.seq
          FROM unnest(:nodes::int[]) WITH ORDINALITY AS n(node, ord)
          JOIN unnest(:seqs::bigint[]) WITH ORDINALITY AS s(seq, ord) USING (ord)
    )
    SELECT m.originator_node_id, m.originator_sequence_id, m.gateway_time, m.topic, b.originator_envelope
      FROM envelopes.gateway_envelopes_meta m
      JOIN envelopes.gateway_envelopes_blob b
        ON b.originator_node_id = m.originator_node_id AND b.originator_sequence_id = m.originator_sequence_id
      LEFT JOIN c ON c.node = m.originator_node_id
     WHERE m.originator_sequence_id > COALESCE(c.seq, 0)
     ORDER BY m.originator_node_id, m.originator_sequence_id
     LIMIT NULLIF(1000, 0)) r;
