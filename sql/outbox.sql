-- The transactional outbox and the doorbell triggers.

-- Messages an application publishes in its own transaction (envelopes.publish()).
-- Consumers read them in id order. publish() takes an in-flight marker naming the
-- id sequence's last value before the row draws its id (src/store/feed/markers.rs), so
-- a reader never passes an id that a running transaction may still commit, and
-- waits for nothing else. The sequence is CACHE 1 (the identity default): ids are
-- drawn in increasing order across sessions.
CREATE TABLE outbox (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    subject      text        NOT NULL,
    payload      bytea       NOT NULL,
    headers      jsonb       NOT NULL DEFAULT '{}',
    created_at   timestamptz NOT NULL DEFAULT pg_catalog.now()
);
COMMENT ON TABLE outbox IS 'Messages published with envelopes.publish(), delivered by the bridge after commit.';

-- The doorbell: one notification per channel per transaction (see src/store/outbox.rs).
-- Statement-level, so a 10,000-row insert costs one trigger call, not 10,000.
CREATE TRIGGER notify_envelopes AFTER INSERT ON gateway_envelopes_meta
    FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.notify_on_insert('envelopes');
CREATE TRIGGER notify_outbox AFTER INSERT ON outbox
    FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.notify_on_insert('outbox');

-- pg_dump carries this state (see "Backup, restore and moving hosts" in the docs):
-- a table created by an extension is otherwise left out of every dump.
SELECT pg_catalog.pg_extension_config_dump('@extschema@.outbox', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.outbox_id_seq', '');
