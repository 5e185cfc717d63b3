-- xmtpd's SelectGatewayEnvelopesBySingleOriginator shape over the extension's
-- tables, the request's values bound as xmtpd's driver binds them.
\set node 3
\set after 0
\set lim 1000
SELECT count(*), sum(pg_catalog.length(r.originator_envelope)), sum(pg_catalog.length(r.topic)), max(r.gateway_time) FROM (
    SELECT m.originator_node_id, m.originator_sequence_id, m.gateway_time, m.topic, b.originator_envelope
      FROM envelopes.gateway_envelopes_meta AS m
      JOIN envelopes.gateway_envelopes_blob AS b
        ON b.originator_node_id = m.originator_node_id
       AND b.originator_sequence_id = m.originator_sequence_id
       AND b.originator_node_id = :node::int
     WHERE m.originator_node_id = :node::int
       AND m.originator_sequence_id > :after::bigint
     ORDER BY m.originator_sequence_id
     LIMIT NULLIF(:lim::int, 0)) r;
