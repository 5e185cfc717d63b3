-- One page of a catch-up wave: cursor entries and ceilings joined to meta and
-- blob, one keyset order, one limit.
SELECT count(*), sum(pg_catalog.length(r.originator_envelope)), sum(pg_catalog.length(r.topic)), max(r.gateway_time) FROM (
    SELECT m.originator_node_id, m.originator_sequence_id, m.gateway_time, m.topic, b.originator_envelope
      FROM envelopes.gateway_envelopes_meta m
      JOIN (SELECT e.* FROM bench_topic_cursor c, unnest(c.topics, c.nodes, c.seqs) AS e(topic, node, seq)) ce
        ON m.topic = ce.topic AND m.originator_node_id = ce.node
      JOIN (SELECT x.* FROM bench_ceilings l, unnest(l.nodes, l.seqs) AS x(node, seq)) cl
        ON cl.node = m.originator_node_id
      JOIN envelopes.gateway_envelopes_blob b
        ON b.originator_node_id = m.originator_node_id
       AND b.originator_sequence_id = m.originator_sequence_id
     WHERE m.originator_sequence_id > ce.seq AND m.originator_sequence_id <= cl.seq
     ORDER BY m.originator_node_id, m.originator_sequence_id
     LIMIT 1000) r;
