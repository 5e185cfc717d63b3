-- In the shape of xmtpd's SelectGatewayEnvelopesByOriginators: the cursor
-- unnested and zipped on the ordinal, each entry's meta rows in a LATERAL with
-- the limit, then their bytes joined per originator.
SELECT count(*), sum(pg_catalog.length(r.originator_envelope)), sum(pg_catalog.length(r.topic)), max(r.gateway_time) FROM (
    WITH e AS (
        SELECT n.node, s.seq
          FROM unnest(:nodes::int[]) WITH ORDINALITY AS n(node, ord)
          JOIN unnest(:seqs::bigint[]) WITH ORDINALITY AS s(seq, ord) USING (ord)
    ), f AS (
        SELECT x.* FROM e CROSS JOIN LATERAL (
               SELECT m.originator_node_id, m.originator_sequence_id, m.gateway_time, m.topic
                 FROM envelopes.gateway_envelopes_meta m
                WHERE m.originator_node_id = e.node AND m.originator_sequence_id > e.seq
                ORDER BY m.originator_sequence_id LIMIT NULLIF(1000, 0)) x
         ORDER BY x.originator_node_id, x.originator_sequence_id LIMIT NULLIF(1000, 0)
    )
    SELECT f.*, b.originator_envelope
      FROM f JOIN envelopes.gateway_envelopes_blob b
        ON b.originator_node_id = f.originator_node_id AND b.originator_sequence_id = f.originator_sequence_id
     ORDER BY f.originator_node_id, f.originator_sequence_id) r;
