-- Single-row insert into one originator (:node) with ids from a shared sequence:
-- every writer reaches each band boundary at the same moment.
SELECT envelopes.insert_gateway_envelope(:node, nextval('crossing_seq'),
       '\x0123456789abcdef0123456789abcdef', '\xa5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5');
