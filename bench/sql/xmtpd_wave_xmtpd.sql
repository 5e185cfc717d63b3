-- In the shape of xmtpd's SelectGatewayEnvelopesWaveScan.
SELECT count(*), sum(pg_catalog.length(r.originator_envelope)), sum(pg_catalog.length(r.topic)), max(r.gateway_time) FROM (
    WITH e AS (
        SELECT t.topic, n.node, s.seq
          FROM unnest(:ctopics::bytea[]) WITH ORDINALITY AS t(topic, ord)
          JOIN unnest(:cnodes::int[]) WITH ORDINALITY AS n(node, ord) USING (ord)
          JOIN unnest(:cseqs::bigint[]) WITH ORDINALITY AS s(seq, ord) USING (ord)
    ), cl AS (
        SELECT n.node, s.seq
          FROM unnest(:nodes::int[]) WITH ORDINALITY AS n(node, ord)
          JOIN unnest(:ceilings::bigint[]) WITH ORDINALITY AS s(seq, ord) USING (ord)
    )
    SELECT m.originator_node_id, m.originator_sequence_id, m.gateway_time, m.topic, b.originator_envelope
      FROM envelopes.gateway_envelopes_meta m
      JOIN e ON m.topic = e.topic AND m.originator_node_id = e.node
      JOIN cl ON cl.node = m.originator_node_id
      JOIN envelopes.gateway_envelopes_blob b
        ON b.originator_node_id = m.originator_node_id AND b.originator_sequence_id = m.originator_sequence_id
     WHERE m.originator_sequence_id > e.seq AND m.originator_sequence_id <= cl.seq
       AND (m.originator_node_id, m.originator_sequence_id) > (0, 0::bigint)
     ORDER BY m.originator_node_id, m.originator_sequence_id
     LIMIT 1000) r;
