-- The outbox: publish() validation, consumer cursors and the status view. NOTIFY
-- delivery and commit order need other sessions: see tests/tests/outbox.rs.
\set VERBOSITY terse
SELECT envelopes.publish('orders.created', '\x7b7d', '{"trace": "abc"}') > 0 AS published;
SELECT subject, payload, headers FROM envelopes.outbox ORDER BY id;
SELECT envelopes.publish(NULL, '\x01');
\echo :LAST_ERROR_SQLSTATE
SELECT envelopes.publish('', '\x01');
\echo :LAST_ERROR_SQLSTATE
SELECT envelopes.publish('has space', '\x01');
\echo :LAST_ERROR_SQLSTATE
-- Subjects every bus takes: no empty token (NATS), no wildcard (NATS, MQTT).
SELECT envelopes.publish('orders..created', '\x01');
\echo :LAST_ERROR_SQLSTATE
SELECT envelopes.publish('orders.*', '\x01');
\echo :LAST_ERROR_SQLSTATE
SELECT envelopes.publish('orders/#', '\x01');
\echo :LAST_ERROR_SQLSTATE
SELECT envelopes.publish('s', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT envelopes.publish('s', '\x01', '"not an object"');
\echo :LAST_ERROR_SQLSTATE
SET envelopes.max_publish_bytes = 2;
SELECT envelopes.publish('s', '\x010203');
\echo :LAST_ERROR_SQLSTATE
RESET envelopes.max_publish_bytes;
SET envelopes.notify_channel = '';
\echo :LAST_ERROR_SQLSTATE

-- A consumer reads committed rows in id order and acknowledges the last one.
SELECT envelopes.consumer_register('bridge');
SELECT envelopes.consumer_register('bridge');  -- idempotent
SELECT id > 0 AS has_id, subject FROM envelopes.consumer_outbox_batch('bridge');
SELECT envelopes.consumer_outbox_ack('bridge', max(id)) AS acked_rows
  FROM envelopes.consumer_outbox_batch('bridge');
SELECT envelopes.consumer_outbox_ack('bridge', 1) AS replayed_ack_is_a_no_op;
SELECT count(*) AS left_after_ack FROM envelopes.consumer_outbox_batch('bridge');
SELECT consumer, outbox_pending, envelopes_pending FROM envelopes.consumer_status;
SELECT consumer, kind, rows FROM envelopes.delivery_log;
SELECT * FROM envelopes.consumer_outbox_batch('nobody');
\echo :LAST_ERROR_SQLSTATE
