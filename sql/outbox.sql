-- The transactional outbox, the doorbell triggers, and consumer cursors.

-- Messages an application publishes in its own transaction (envelopes.publish()).
-- inserted_xid orders rows by commit safety: a consumer reads only rows whose
-- transaction is older than every transaction still running, in (inserted_xid, id)
-- order, so a row that commits late is never skipped.
CREATE TABLE outbox (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    subject      text        NOT NULL,
    payload      bytea       NOT NULL,
    headers      jsonb       NOT NULL DEFAULT '{}',
    created_at   timestamptz NOT NULL DEFAULT pg_catalog.now(),
    inserted_xid xid8        NOT NULL DEFAULT pg_catalog.pg_current_xact_id()
);
CREATE INDEX outbox_commit_order_idx ON outbox (inserted_xid, id);
COMMENT ON TABLE outbox IS 'Messages published with envelopes.publish(), delivered by the bridge after commit.';

-- The doorbell: one notification per channel per transaction (see src/outbox.rs).
-- Statement-level, so a 10,000-row insert costs one trigger call, not 10,000.
CREATE TRIGGER notify_envelopes AFTER INSERT ON gateway_envelopes_meta
    FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.notify_on_insert('envelopes');
CREATE TRIGGER notify_outbox AFTER INSERT ON outbox
    FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.notify_on_insert('outbox');

-- Consumers (bridges) and their durable cursors. The outbox cursor is the last
-- acknowledged (inserted_xid, id); the envelope cursor is a vector clock, one row
-- per originator.
CREATE TABLE consumers (
    name        text        PRIMARY KEY CHECK (name <> ''),
    outbox_xid  xid8        NOT NULL DEFAULT '0',
    outbox_id   bigint      NOT NULL DEFAULT 0,
    created_at  timestamptz NOT NULL DEFAULT pg_catalog.now(),
    acked_at    timestamptz
);
CREATE TABLE consumer_envelope_cursors (
    consumer           text    NOT NULL REFERENCES consumers (name) ON DELETE CASCADE,
    originator_node_id integer NOT NULL,
    sequence_id        bigint  NOT NULL,
    PRIMARY KEY (consumer, originator_node_id)
);

-- The delivery log: one row per acknowledged batch, with when its rows were
-- written (committed_from .. committed_to, the rows' created_at / gateway_time)
-- and when the consumer acknowledged them.
CREATE TABLE delivery_log (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer        text        NOT NULL REFERENCES consumers (name) ON DELETE CASCADE,
    kind            text        NOT NULL CHECK (kind IN ('outbox', 'envelopes')),
    rows            bigint      NOT NULL,
    committed_from  timestamptz,
    committed_to    timestamptz,
    acknowledged_at timestamptz NOT NULL DEFAULT pg_catalog.now()
);
CREATE INDEX delivery_log_consumer_idx ON delivery_log (consumer, acknowledged_at);

-- Registers a consumer (idempotent). A new consumer starts at the beginning of
-- both streams, or at their current end when from_start is false.
CREATE FUNCTION consumer_register(name text, from_start boolean DEFAULT true)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF name IS NULL OR name = '' THEN
        RAISE EXCEPTION 'consumer name must not be NULL or empty' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO @extschema@.consumers AS c (name) VALUES (consumer_register.name)
    ON CONFLICT DO NOTHING;
    IF FOUND AND NOT from_start THEN
        UPDATE @extschema@.consumers c
           SET outbox_xid = o.inserted_xid, outbox_id = o.id
          FROM (SELECT inserted_xid, id FROM @extschema@.outbox
                 ORDER BY inserted_xid DESC, id DESC LIMIT 1) o
         WHERE c.name = consumer_register.name;
        INSERT INTO @extschema@.consumer_envelope_cursors (consumer, originator_node_id, sequence_id)
        SELECT consumer_register.name, x.originator_node_id, x.max_sequence_id
          FROM @extschema@.originator_ceilings() x;
    END IF;
END $$;

-- The next outbox rows a consumer has not acknowledged, in commit-safe order:
-- after its cursor, ordered by (inserted_xid, id), and only from transactions older
-- than every one still running, so a late commit is never skipped.
CREATE FUNCTION consumer_outbox_batch(consumer text, batch_size integer DEFAULT 1000)
RETURNS TABLE (id bigint, inserted_xid xid8, subject text, payload bytea, headers jsonb,
               created_at timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    cur record;
BEGIN
    IF batch_size IS NULL OR batch_size <= 0 THEN
        RAISE EXCEPTION 'batch_size must be positive (got %)', batch_size USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT c.outbox_xid, c.outbox_id INTO cur FROM @extschema@.consumers c WHERE c.name = consumer;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'consumer "%" does not exist', consumer USING ERRCODE = 'undefined_object',
              HINT = 'Create it with envelopes.consumer_register(name).';
    END IF;
    RETURN QUERY
    SELECT o.id, o.inserted_xid, o.subject, o.payload, o.headers, o.created_at
      FROM @extschema@.outbox o
     WHERE (o.inserted_xid, o.id) > (cur.outbox_xid, cur.outbox_id)
       AND o.inserted_xid < pg_snapshot_xmin(pg_current_snapshot())
     ORDER BY o.inserted_xid, o.id
     LIMIT batch_size;
END $$;

-- Moves a consumer's outbox cursor forward to (inserted_xid, id), the last row it
-- delivered, and logs the batch. Never moves it backwards (a replayed ack is a
-- no-op), and refuses a position no batch could have returned.
CREATE FUNCTION consumer_outbox_ack(consumer text, inserted_xid xid8, id bigint)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    cur record;
    n bigint;
    first_at timestamptz;
    last_at timestamptz;
BEGIN
    IF inserted_xid IS NULL OR id IS NULL THEN
        RAISE EXCEPTION 'inserted_xid and id must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    SELECT c.outbox_xid, c.outbox_id INTO cur FROM @extschema@.consumers c
     WHERE c.name = consumer FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'consumer "%" does not exist', consumer USING ERRCODE = 'undefined_object',
              HINT = 'Create it with envelopes.consumer_register(name).';
    END IF;
    IF inserted_xid >= pg_snapshot_xmin(pg_current_snapshot()) THEN
        RAISE EXCEPTION 'cannot acknowledge past transaction %: it may not have committed yet', inserted_xid
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF (inserted_xid, id) <= (cur.outbox_xid, cur.outbox_id) THEN
        RETURN 0;
    END IF;
    SELECT count(*), min(o.created_at), max(o.created_at) INTO n, first_at, last_at
      FROM @extschema@.outbox o
     WHERE (o.inserted_xid, o.id) > (cur.outbox_xid, cur.outbox_id)
       AND (o.inserted_xid, o.id) <= (consumer_outbox_ack.inserted_xid, consumer_outbox_ack.id);
    UPDATE @extschema@.consumers c
       SET outbox_xid = consumer_outbox_ack.inserted_xid, outbox_id = consumer_outbox_ack.id,
           acked_at = now()
     WHERE c.name = consumer;
    INSERT INTO @extschema@.delivery_log (consumer, kind, rows, committed_from, committed_to)
    VALUES (consumer, 'outbox', n, first_at, last_at);
    RETURN n;
END $$;

-- Moves a consumer's envelope cursor forward, per originator, to the last sequence
-- id it delivered (never backwards), and logs the batch.
CREATE FUNCTION consumer_envelope_ack(consumer text, originator_node_ids integer[], sequence_ids bigint[])
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n bigint := 0;
    first_at timestamptz;
    last_at timestamptz;
BEGIN
    IF originator_node_ids IS NULL OR sequence_ids IS NULL THEN
        RAISE EXCEPTION 'originator_node_ids and sequence_ids must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF cardinality(originator_node_ids) <> cardinality(sequence_ids) THEN
        RAISE EXCEPTION 'originator_node_ids has % elements but sequence_ids has %',
              cardinality(originator_node_ids), cardinality(sequence_ids) USING ERRCODE = '2202E';
    END IF;
    IF array_position(originator_node_ids, NULL) IS NOT NULL OR array_position(sequence_ids, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'cursor arrays must not contain NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    PERFORM FROM @extschema@.consumers c WHERE c.name = consumer FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'consumer "%" does not exist', consumer USING ERRCODE = 'undefined_object',
              HINT = 'Create it with envelopes.consumer_register(name).';
    END IF;
    WITH target AS (
        SELECT t.node, max(t.seq) AS seq
          FROM unnest(originator_node_ids, sequence_ids) AS t(node, seq) GROUP BY t.node
    ), moved AS (
        SELECT t.node, COALESCE(c.sequence_id, 0) AS old_seq, t.seq AS new_seq
          FROM target t
          LEFT JOIN @extschema@.consumer_envelope_cursors c
                 ON c.consumer = consumer_envelope_ack.consumer AND c.originator_node_id = t.node
         WHERE t.seq > COALESCE(c.sequence_id, 0)
    ), counted AS (
        SELECT count(*) AS n, min(m.gateway_time) AS first_at, max(m.gateway_time) AS last_at
          FROM moved v
          JOIN @extschema@.gateway_envelopes_meta m
            ON m.originator_node_id = v.node
           AND m.originator_sequence_id > v.old_seq AND m.originator_sequence_id <= v.new_seq
    ), upsert AS (
        INSERT INTO @extschema@.consumer_envelope_cursors AS c (consumer, originator_node_id, sequence_id)
        SELECT consumer_envelope_ack.consumer, v.node, v.new_seq FROM moved v
        ON CONFLICT ON CONSTRAINT consumer_envelope_cursors_pkey
        DO UPDATE SET sequence_id = GREATEST(c.sequence_id, EXCLUDED.sequence_id)
    )
    SELECT counted.n, counted.first_at, counted.last_at INTO n, first_at, last_at FROM counted;
    IF n > 0 THEN
        UPDATE @extschema@.consumers c SET acked_at = now() WHERE c.name = consumer;
        INSERT INTO @extschema@.delivery_log (consumer, kind, rows, committed_from, committed_to)
        VALUES (consumer, 'envelopes', n, first_at, last_at);
    END IF;
    RETURN n;
END $$;

-- How full the server's NOTIFY queue is (0..1); a listener that stops reading its
-- notifications makes it grow.
CREATE FUNCTION notification_queue_usage() RETURNS double precision
LANGUAGE sql STABLE AS $$ SELECT pg_catalog.pg_notification_queue_usage() $$;

-- Per consumer: where it stands, what is committed but not yet acknowledged, and
-- how old the oldest such row is. envelopes_pending counts rows up to each
-- originator's ceiling, so it covers exactly what the consumer can read next.
CREATE VIEW consumer_status AS
SELECT c.name AS consumer,
       c.outbox_xid,
       c.outbox_id,
       o.pending AS outbox_pending,
       pg_catalog.now() - o.oldest AS outbox_oldest_pending_age,
       e.pending AS envelopes_pending,
       pg_catalog.now() - e.oldest AS envelopes_oldest_pending_age,
       c.acked_at AS last_acknowledged_at,
       @extschema@.notification_queue_usage() AS notification_queue_usage
  FROM @extschema@.consumers c
  CROSS JOIN LATERAL (
        SELECT count(*) AS pending, min(ob.created_at) AS oldest
          FROM @extschema@.outbox ob
         WHERE (ob.inserted_xid, ob.id) > (c.outbox_xid, c.outbox_id)) o
  CROSS JOIN LATERAL (
        SELECT count(*) AS pending, min(m.gateway_time) AS oldest
          FROM @extschema@.originator_ceilings() x
          LEFT JOIN @extschema@.consumer_envelope_cursors ec
                 ON ec.consumer = c.name AND ec.originator_node_id = x.originator_node_id
          JOIN @extschema@.gateway_envelopes_meta m
            ON m.originator_node_id = x.originator_node_id
           AND m.originator_sequence_id > COALESCE(ec.sequence_id, 0)
           AND m.originator_sequence_id <= x.max_sequence_id) e;
COMMENT ON VIEW consumer_status IS 'Consumer cursors, what is committed but not yet acknowledged, and the NOTIFY queue usage.';
