-- Single-row insert by 8 writers, each into an originator of its own
-- (:node_base + client), into a band created beforehand, with ids from a shared
-- sequence: the load that pruning must not disturb.
\set node :node_base + :client_id % 8
SELECT envelopes.insert_gateway_envelope(:node, nextval('prune_seq'),
       '\x0123456789abcdef0123456789abcdef', '\xa5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5');
