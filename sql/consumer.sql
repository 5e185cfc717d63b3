-- Consumers (bridges): their durable positions, the acknowledgement functions,
-- the delivery log, dead letters and the status view. The batch functions are
-- in Rust (src/store/consumer/): they read through the change feed's gate.

-- The insert path's high-water marks (shared memory, src/store/feed/highwater.rs) of
-- this database start again when meta is truncated.
CREATE TRIGGER forget_high_water_marks AFTER TRUNCATE ON gateway_envelopes_meta
    FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.forget_high_water_marks();
-- A store created again in this database (DROP EXTENSION, then CREATE EXTENSION)
-- starts with none of the marks the dropped one left in shared memory: those stood
-- for rows that are gone, and every in-order insert would be taken for late.
TRUNCATE gateway_envelopes_meta;

-- A consumer's positions: the outbox id and the late-envelope feed id it has
-- acknowledged up to, and (in consumer_envelope_cursors) a vector clock over
-- originators. version grows with every acknowledgement that moves the vector
-- clock; each cursor row carries the version that last moved it, so a backend
-- that caches the cursor reads only the rows newer than its copy. Change
-- positions only through the functions below. owner is the role that registered
-- it: only that role (its members) and the extension's owner read its batches
-- and move its positions. It is NULL only for consumers made before 0.4.0, until
-- the first role that acts for one claims it. A regrole, not an oid: a dump
-- carries it as the role's name, so it names the same role in another cluster
-- (whose roles have other oids; restore the roles first, pg_dumpall --globals-only).
CREATE TABLE consumers (
    name        text        PRIMARY KEY CHECK (name <> ''),
    outbox_id   bigint      NOT NULL DEFAULT 0,
    created_at  timestamptz NOT NULL DEFAULT pg_catalog.now(),
    acked_at    timestamptz,
    late_id     bigint      NOT NULL DEFAULT 0,
    version     bigint      NOT NULL DEFAULT 0,
    owner       regrole
);
CREATE TABLE consumer_envelope_cursors (
    consumer           text    NOT NULL,
    originator_node_id integer NOT NULL,
    sequence_id        bigint  NOT NULL,
    version            bigint  NOT NULL DEFAULT 0,
    PRIMARY KEY (consumer, originator_node_id)
);
CREATE INDEX consumer_envelope_cursors_version_idx ON consumer_envelope_cursors (consumer, version);

-- A consumer's cursors, delivery log and dead letters go with it. Not by foreign
-- keys: these tables are the extension's, so a restore creates them with their
-- constraints (CREATE EXTENSION) before it loads their rows, and a parallel
-- pg_restore loads each table in a session of its own, in any order: a dead
-- letter may arrive before its consumer. The functions write rows only for a
-- consumer that exists.
CREATE FUNCTION _consumer_deleted() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    DELETE FROM @extschema@.consumer_envelope_cursors WHERE consumer = OLD.name;
    DELETE FROM @extschema@.delivery_log WHERE consumer = OLD.name;
    DELETE FROM @extschema@.dead_letters WHERE consumer = OLD.name;
    RETURN NULL;
END
$$;

-- The delivery log: one row per acknowledged batch, with when its rows were
-- written (committed_from .. committed_to, the rows' created_at / gateway_time)
-- and when the consumer acknowledged them.
CREATE TABLE delivery_log (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer        text        NOT NULL,
    kind            text        NOT NULL CHECK (kind IN ('outbox', 'envelopes')),
    rows            bigint      NOT NULL,
    committed_from  timestamptz,
    committed_to    timestamptz,
    acknowledged_at timestamptz NOT NULL DEFAULT pg_catalog.now()
);
CREATE INDEX delivery_log_consumer_idx ON delivery_log (consumer, acknowledged_at);

-- Rows a consumer could not deliver because its bus refuses them (too large, a
-- subject or key the bus rejects, an ACL), set aside at the first refusal so that
-- the rows after them flow. The cursor has moved past them. The bridge tries each
-- again by itself a few times on a short schedule (next_attempt_at); after that it
-- stays here until retry_dead_letters() asks the consumer to try it again.
CREATE TABLE dead_letters (
    id                     bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer               text        NOT NULL,
    kind                   text        NOT NULL CHECK (kind IN ('envelope', 'outbox')),
    originator_node_id     integer,
    originator_sequence_id bigint,
    outbox_id              bigint,
    reason                 text        NOT NULL,
    -- The SQLSTATE, or the bus's own error code or class.
    error                  text,
    attempts               integer     NOT NULL CHECK (attempts > 0),
    first_attempt_at       timestamptz NOT NULL,
    last_attempt_at        timestamptz NOT NULL,
    retry_requested_at     timestamptz,
    -- When the bridge tries the row again by itself (NULL: it will not; after its
    -- attempts ran out the row waits for retry_dead_letters()).
    next_attempt_at        timestamptz,
    CONSTRAINT dead_letters_row CHECK (
        CASE kind WHEN 'envelope' THEN originator_node_id IS NOT NULL AND originator_sequence_id IS NOT NULL
                                       AND outbox_id IS NULL
                  ELSE outbox_id IS NOT NULL AND originator_node_id IS NULL AND originator_sequence_id IS NULL
        END),
    CONSTRAINT dead_letters_once UNIQUE NULLS NOT DISTINCT
        (consumer, kind, originator_node_id, originator_sequence_id, outbox_id)
);
CREATE TRIGGER consumer_deleted AFTER DELETE ON consumers
    FOR EACH ROW EXECUTE FUNCTION @extschema@._consumer_deleted();
CREATE INDEX dead_letters_retry_idx ON dead_letters (consumer) WHERE retry_requested_at IS NOT NULL;
CREATE INDEX dead_letters_next_attempt_idx ON dead_letters (consumer, next_attempt_at)
    WHERE next_attempt_at IS NOT NULL;
COMMENT ON TABLE dead_letters IS
    'Rows a consumer''s bus refused, set aside at once so the rest flows, tried again by the bridge on a short schedule (next_attempt_at) and then kept until retry_dead_letters().';

-- Locks a consumer's row for an update, or raises 42704 for an unknown one and
-- 42501 when the calling role may not act for it.
CREATE FUNCTION _lock_consumer(consumer text) RETURNS @extschema@.consumers
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c @extschema@.consumers;
BEGIN
    IF consumer IS NULL THEN
        RAISE EXCEPTION 'consumer must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    SELECT * INTO c FROM @extschema@.consumers WHERE name = consumer FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'consumer "%" does not exist', consumer USING ERRCODE = 'undefined_object',
              HINT = 'Create it with envelopes.consumer_register(name).';
    END IF;
    PERFORM @extschema@._check_consumer_owner(c);
    RETURN c;
END $$;

-- Raises 42501 when the calling role may not act for consumer c (see consumers);
-- a consumer without an owner becomes the caller's, unless another role claimed
-- it first.
CREATE FUNCTION _check_consumer_owner(c @extschema@.consumers) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp
AS $$ SELECT @extschema@._consumer_owner_check(c.name, c.owner) $$;

-- Hands a consumer over to another role (for the roles that may act for it now).
CREATE FUNCTION consumer_set_owner(consumer text, new_owner regrole)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF new_owner IS NULL THEN
        RAISE EXCEPTION 'new_owner must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    PERFORM @extschema@._lock_consumer(consumer);
    UPDATE @extschema@.consumers c SET owner = new_owner WHERE c.name = consumer;
END $$;

-- Makes this session the active bridge of a consumer, unless another session
-- already is: (true, NULL) when this session holds the lease now, (false, pid)
-- when the session with that backend pid holds it (pid 0: unknown). The lease
-- lasts until the session ends (or consumer_lease_release); while it is held, the
-- functions that move the consumer's positions or record its dead letters fail
-- with 55006 in any other session, so two bridges under one name never both
-- acknowledge. 42704 for an unknown consumer, 42501 for one the caller may not
-- act for.
CREATE FUNCTION consumer_lease(consumer text, OUT acquired boolean, OUT holder_pid integer)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c @extschema@.consumers;
BEGIN
    IF consumer IS NULL THEN
        RAISE EXCEPTION 'consumer must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    SELECT * INTO c FROM @extschema@.consumers k WHERE k.name = consumer_lease.consumer;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'consumer "%" does not exist', consumer USING ERRCODE = 'undefined_object',
              HINT = 'Create it with envelopes.consumer_register(name).';
    END IF;
    PERFORM @extschema@._check_consumer_owner(c);
    holder_pid := @extschema@._lease_take('egress', consumer);
    acquired := holder_pid IS NULL;
END $$;

-- Gives up this session's lease of a consumer (true if it held it).
CREATE FUNCTION consumer_lease_release(consumer text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF consumer IS NULL THEN
        RAISE EXCEPTION 'consumer must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    RETURN @extschema@._lease_release('egress', consumer);
END $$;

-- Refuses a position no batch could have returned: above the feed's last id.
CREATE FUNCTION _check_drawn_position(what text, acked bigint, feed_sequence regclass) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF acked > COALESCE(pg_catalog.pg_sequence_last_value(feed_sequence), 0) THEN
        RAISE EXCEPTION 'cannot acknowledge % %: no such id has been drawn yet', what, acked
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
END $$;

-- Moves a consumer's outbox position forward to id, the last row it delivered,
-- and logs the batch. Never moves it backwards (a replayed ack is a no-op).
CREATE FUNCTION consumer_outbox_ack(consumer text, id bigint)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    cur @extschema@.consumers;
    n bigint;
    first_at timestamptz;
    last_at timestamptz;
BEGIN
    IF id IS NULL THEN
        RAISE EXCEPTION 'id must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    cur := @extschema@._lock_consumer(consumer);
    PERFORM @extschema@._lease_check('egress', consumer);
    PERFORM @extschema@._check_drawn_position('outbox id', id, '@extschema@.outbox_id_seq');
    IF id <= cur.outbox_id THEN
        RETURN 0;
    END IF;
    SELECT count(*), min(o.created_at), max(o.created_at) INTO n, first_at, last_at
      FROM @extschema@.outbox o
     WHERE o.id > cur.outbox_id AND o.id <= consumer_outbox_ack.id;
    UPDATE @extschema@.consumers c SET outbox_id = consumer_outbox_ack.id, acked_at = now()
     WHERE c.name = consumer;
    INSERT INTO @extschema@.delivery_log (consumer, kind, rows, committed_from, committed_to)
    VALUES (consumer, 'outbox', n, first_at, last_at);
    RETURN n;
END $$;

-- consumer_envelope_ack is in Rust (src/store/consumer/): it counts the rows it
-- acknowledges with index range scans of the band leaves, which no plan over the
-- partitioned tables can turn into a scan of every row.

-- Sets a row aside for a consumer whose bus refuses it: called by the bridge at
-- the refusal, before it acknowledges past the row. next_attempt_at is when the
-- bridge means to try it again by itself (NULL: not any more, it waits for
-- retry_dead_letters()). Recording the same row again adds the attempts, keeps
-- the first attempt's time and clears an operator's retry request. Returns the
-- dead letter's id.
CREATE FUNCTION consumer_dead_letter(consumer text, kind text, originator_node_id integer,
                                     originator_sequence_id bigint, outbox_id bigint,
                                     reason text, error text, attempts integer,
                                     first_attempt_at timestamptz DEFAULT NULL,
                                     next_attempt_at timestamptz DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    new_id bigint;
BEGIN
    IF kind IS NULL OR reason IS NULL OR attempts IS NULL THEN
        RAISE EXCEPTION 'kind, reason and attempts must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF kind NOT IN ('envelope', 'outbox') THEN
        RAISE EXCEPTION 'kind must be envelope or outbox (got %)', kind USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF kind = 'envelope' AND (originator_node_id IS NULL OR originator_sequence_id IS NULL) THEN
        RAISE EXCEPTION 'an envelope dead letter needs originator_node_id and originator_sequence_id'
              USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF kind = 'outbox' AND outbox_id IS NULL THEN
        RAISE EXCEPTION 'an outbox dead letter needs outbox_id' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF (kind = 'envelope' AND outbox_id IS NOT NULL)
       OR (kind = 'outbox' AND (originator_node_id IS NOT NULL OR originator_sequence_id IS NOT NULL)) THEN
        RAISE EXCEPTION 'a dead letter names either an envelope (originator ids) or an outbox row (outbox_id), not both'
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF attempts <= 0 THEN
        RAISE EXCEPTION 'attempts must be positive (got %)', attempts USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM @extschema@._lock_consumer(consumer);
    PERFORM @extschema@._lease_check('egress', consumer);
    INSERT INTO @extschema@.dead_letters AS d
        (consumer, kind, originator_node_id, originator_sequence_id, outbox_id, reason, error,
         attempts, first_attempt_at, last_attempt_at, next_attempt_at)
    VALUES (consumer, kind, originator_node_id, originator_sequence_id, outbox_id, reason, error,
            attempts, COALESCE(first_attempt_at, now()), now(), next_attempt_at)
    ON CONFLICT ON CONSTRAINT dead_letters_once DO UPDATE
       SET attempts = d.attempts + EXCLUDED.attempts, reason = EXCLUDED.reason, error = EXCLUDED.error,
           last_attempt_at = now(), next_attempt_at = EXCLUDED.next_attempt_at
    RETURNING d.id INTO new_id;
    RETURN new_id;
END $$;

-- Asks consumers to try their dead letters again (all of them, one consumer's,
-- or the given ids; only of consumers the calling role may act for). The bridge
-- picks them up with consumer_dead_letter_retries().
CREATE FUNCTION retry_dead_letters(consumer text DEFAULT NULL, ids bigint[] DEFAULT NULL)
RETURNS bigint LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH r AS (
        UPDATE @extschema@.dead_letters d SET retry_requested_at = pg_catalog.now()
          FROM @extschema@.consumers c
         WHERE c.name = d.consumer AND @extschema@._acts_for(COALESCE(c.owner::pg_catalog.oid, 0))
           AND ($1 IS NULL OR d.consumer = $1) AND ($2 IS NULL OR d.id = ANY ($2))
        RETURNING 1)
    SELECT count(*) FROM r
$$;

-- The dead letters of a consumer that are due again: asked for by
-- retry_dead_letters(), or whose next_attempt_at has come. With their rows (NULL
-- columns when the row no longer exists, e.g. pruned), the attempts so far and
-- whether an operator asked (the bridge then reconnects to its bus first, to
-- learn its limits anew).
-- The bridge asks on every poll, so the common answer — nothing due — costs two
-- index probes; the join with the envelope view is planned only when there is
-- something to return.
CREATE FUNCTION consumer_dead_letter_retries(consumer text, batch_size integer DEFAULT 100)
RETURNS TABLE (dead_letter_id bigint, kind text, originator_node_id integer, originator_sequence_id bigint,
               gateway_time timestamptz, topic bytea, payer_id integer, expiry bigint,
               originator_envelope bytea, outbox_id bigint, subject text, payload bytea, headers jsonb,
               created_at timestamptz, attempts integer, retry_requested boolean)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c @extschema@.consumers;
BEGIN
    IF consumer IS NULL OR batch_size IS NULL THEN
        RAISE EXCEPTION 'consumer and batch_size must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF batch_size <= 0 THEN
        RAISE EXCEPTION 'batch_size must be positive (got %)', batch_size USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO c FROM @extschema@.consumers WHERE name = consumer_dead_letter_retries.consumer;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'consumer "%" does not exist', consumer USING ERRCODE = 'undefined_object',
              HINT = 'Create it with envelopes.consumer_register(name).';
    END IF;
    PERFORM @extschema@._check_consumer_owner(c);
    IF NOT EXISTS (SELECT FROM @extschema@.dead_letters d
                    WHERE d.consumer = consumer_dead_letter_retries.consumer
                      AND d.retry_requested_at IS NOT NULL)
       AND NOT EXISTS (SELECT FROM @extschema@.dead_letters d
                        WHERE d.consumer = consumer_dead_letter_retries.consumer
                          AND d.next_attempt_at IS NOT NULL AND d.next_attempt_at <= pg_catalog.now()) THEN
        RETURN;
    END IF;
    -- Handing a row out answers the operator's request for it: the request is
    -- consumed here, not by the refusal that may follow (consumer_dead_letter
    -- leaves retry_requested_at alone), so that a retry_dead_letters() made
    -- while the bridge is at the row is kept for one more attempt. Its
    -- next_attempt_at makes it due again should the bridge stop before it
    -- records the attempt.
    RETURN QUERY
    WITH picked AS (
        SELECT d.id, d.retry_requested_at IS NOT NULL AS requested
          FROM @extschema@.dead_letters d
         WHERE d.consumer = consumer_dead_letter_retries.consumer
           AND (d.retry_requested_at IS NOT NULL OR d.next_attempt_at <= pg_catalog.now())
         ORDER BY d.id
         LIMIT batch_size
           FOR UPDATE OF d),
    handed AS (
        UPDATE @extschema@.dead_letters d
           SET retry_requested_at = NULL,
               next_attempt_at = COALESCE(d.next_attempt_at, pg_catalog.now())
          FROM picked p
         WHERE d.id = p.id AND p.requested
        RETURNING d.id)
    SELECT d.id, d.kind, d.originator_node_id, d.originator_sequence_id,
           v.gateway_time, v.topic, v.payer_id, v.expiry, v.originator_envelope,
           d.outbox_id, o.subject, o.payload, o.headers, o.created_at, d.attempts,
           p.requested
      FROM picked p
      JOIN @extschema@.dead_letters d ON d.id = p.id
      LEFT JOIN @extschema@.gateway_envelopes_view v
             ON d.kind = 'envelope' AND v.originator_node_id = d.originator_node_id
            AND v.originator_sequence_id = d.originator_sequence_id
      LEFT JOIN @extschema@.outbox o ON d.kind = 'outbox' AND o.id = d.outbox_id
     ORDER BY d.id;
END $$;

-- Removes dead letters a consumer delivered on retry (or whose rows are gone).
CREATE FUNCTION consumer_dead_letter_resolved(consumer text, ids bigint[])
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n bigint;
BEGIN
    IF ids IS NULL THEN
        RAISE EXCEPTION 'ids must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    PERFORM @extschema@._lock_consumer(consumer);
    PERFORM @extschema@._lease_check('egress', consumer);
    DELETE FROM @extschema@.dead_letters d
     WHERE d.consumer = consumer_dead_letter_resolved.consumer AND d.id = ANY (ids);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

-- The dead letters of one consumer, or of every consumer the calling role may act
-- for (NULL), oldest first: for `envelopes-bridge status` and operators, who need
-- no privilege on the table itself.
CREATE FUNCTION consumer_dead_letters(consumer text DEFAULT NULL)
RETURNS SETOF @extschema@.dead_letters LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT d.* FROM @extschema@.dead_letters d
      JOIN @extschema@.consumers c ON c.name = d.consumer
     WHERE ($1 IS NULL OR d.consumer = $1) AND @extschema@._acts_for(COALESCE(c.owner::pg_catalog.oid, 0))
     ORDER BY d.id
$$;

-- How many rows a consumer has not acknowledged yet among those it can read now,
-- cheaply enough to ask every round of a bridge that is catching up: the
-- envelopes consumer_envelopes_pending counts (each originator's rows after the
-- consumer's cursor up to its ceiling, and the late arrivals after its late-feed
-- position, each row once: ids never used, such as a rolled-back insert's or the
-- gap below a first id of 1,500,000, count nothing) plus the outbox rows after its
-- outbox position. Each originator costs one read of its meta bands from the
-- consumer's cursor (an index probe when nothing is pending; those a batch of
-- this backend found settled are skipped), up to the last row whose transaction
-- had ended, without the blobs. (Before 0.4.0 was released this
-- counted ids, which a gap made count rows that never existed.)
CREATE FUNCTION consumer_lag(consumer text) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c @extschema@.consumers;
    envelopes bigint;
BEGIN
    IF consumer IS NULL THEN
        RAISE EXCEPTION 'consumer must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    SELECT * INTO c FROM @extschema@.consumers k WHERE k.name = consumer_lag.consumer;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'consumer "%" does not exist', consumer USING ERRCODE = 'undefined_object',
              HINT = 'Create it with envelopes.consumer_register(name).';
    END IF;
    PERFORM @extschema@._check_consumer_owner(c);
    SELECT e.pending INTO envelopes FROM @extschema@.consumer_envelopes_pending(c.name) e;
    RETURN COALESCE(envelopes, 0)
         + (SELECT pg_catalog.count(*) FROM @extschema@.outbox ob WHERE ob.id > c.outbox_id);
END $$;

-- Each standby's flush position, as pg_stat_replication shows it to a
-- superuser: a consumer role sees other users' rows there without their LSNs,
-- and egress in --forward-after standby-flush mode must know every standby's
-- (it publishes a batch only once the synchronous standbys have flushed it, so
-- that a failover cannot take back a row already forwarded). Only what that
-- needs: no addresses, no process ids.
CREATE FUNCTION standby_flush_positions()
RETURNS TABLE (application_name text, state text, sync_state text, flush_lsn pg_lsn)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
    SELECT r.application_name::text, r.state, r.sync_state, r.flush_lsn
      FROM pg_catalog.pg_stat_replication r
$$;

-- How full the server's NOTIFY queue is (0..1); a listener that stops reading its
-- notifications makes it grow.
CREATE FUNCTION notification_queue_usage() RETURNS double precision
LANGUAGE sql STABLE AS $$ SELECT pg_catalog.pg_notification_queue_usage() $$;

-- Per consumer: where it stands, what is committed but not yet acknowledged, how
-- old the oldest such row is, and its dead letters. envelopes_pending counts the
-- in-order envelopes up to each originator's ceiling and the late arrivals after
-- the consumer's late-feed position: what it can read next.
CREATE VIEW consumer_status AS
SELECT c.name AS consumer,
       c.outbox_id,
       c.late_id,
       o.pending AS outbox_pending,
       pg_catalog.now() - o.oldest AS outbox_oldest_pending_age,
       e.pending AS envelopes_pending,
       pg_catalog.now() - e.oldest AS envelopes_oldest_pending_age,
       c.acked_at AS last_acknowledged_at,
       d.dead_letters,
       @extschema@.notification_queue_usage() AS notification_queue_usage,
       c.owner::pg_catalog.regrole AS owner
  FROM @extschema@.consumers c
  CROSS JOIN LATERAL (
        SELECT count(*) AS pending, min(ob.created_at) AS oldest
          FROM @extschema@.outbox ob
         WHERE ob.id > c.outbox_id) o
  CROSS JOIN LATERAL @extschema@.consumer_envelopes_pending(c.name) e
  CROSS JOIN LATERAL (
        SELECT count(*) AS dead_letters FROM @extschema@.dead_letters dl WHERE dl.consumer = c.name) d;
COMMENT ON VIEW consumer_status IS 'Consumer positions, what is committed but not yet acknowledged, dead letters and the NOTIFY queue usage.';

-- pg_dump carries this state (see "Backup, restore and moving hosts" in the docs):
-- a table created by an extension is otherwise left out of every dump.
SELECT pg_catalog.pg_extension_config_dump('@extschema@.consumers', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.consumer_envelope_cursors', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.delivery_log', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.delivery_log_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.dead_letters', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.dead_letters_id_seq', '');
