-- In the shape of xmtpd's SelectNewestFromTopics.
SELECT count(*), sum(pg_catalog.length(r.originator_envelope)), sum(pg_catalog.length(r.topic)), max(r.gateway_time) FROM (
    WITH latest AS (
        SELECT DISTINCT ON (m.topic) m.originator_node_id, m.originator_sequence_id, m.gateway_time, m.topic
          FROM envelopes.gateway_envelopes_meta m
         WHERE m.topic = ANY (:topics::bytea[])
         ORDER BY m.topic, m.gateway_time DESC)
    SELECT l.*, b.originator_envelope
      FROM latest l JOIN envelopes.gateway_envelopes_blob b
        ON b.originator_node_id = l.originator_node_id AND b.originator_sequence_id = l.originator_sequence_id
     ORDER BY l.topic) r;
