-- pg_envelopes 0.2.0 -> 0.3.0: a change feed that never skips and never stalls.
--
-- Released with 0.3.0; never edit it afterwards (scripts/test.sh checks
-- sql/releases/SHA256SUMS). Every statement brings a 0.2.0 database to exactly
-- what a fresh 0.3.0 install creates (tests/tests/upgrade.rs compares the two).
\echo Use "ALTER EXTENSION pg_envelopes UPDATE TO '0.3.0'" to load this file. \quit

-- Outbox writers take no in-flight marker before 0.3.0. Wait for the ones that
-- are running, and keep new ones out until the upgrade commits: the consumers'
-- outbox positions are converted below from what has committed by then.
LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE;

-- Late arrivals: flagged in meta and recorded in a feed of their own.
ALTER TABLE gateway_envelopes_meta ADD COLUMN late boolean NOT NULL DEFAULT false;

-- The late-envelope feed: one entry per envelope that arrived below a sequence id
-- of its originator that another transaction had already committed (a consumer
-- may have moved past it). Written by the insert functions in the inserting
-- statement; read by the consumer functions in id order, like the outbox. The ids
-- come from a CACHE 1 sequence, so they are drawn in increasing order across
-- sessions, which the feed's in-flight markers rely on (src/feed/markers.rs).
CREATE TABLE late_envelopes (
    id                     bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    originator_node_id     integer     NOT NULL,
    originator_sequence_id bigint      NOT NULL,
    recorded_at            timestamptz NOT NULL DEFAULT pg_catalog.now()
);
-- prune_expired() deletes the entries of the envelopes it deletes.
CREATE INDEX late_envelopes_key_idx ON late_envelopes (originator_node_id, originator_sequence_id);
COMMENT ON TABLE late_envelopes IS
    'Envelopes inserted below a sequence id their originator had already committed; consumers read them from here.';

-- The outbox is read in id order behind in-flight markers; the transaction-id
-- horizon no longer orders it. A consumer's new position is just before the
-- first row it had not acknowledged in the old (inserted_xid, id) order: rows
-- after that may be delivered again, none is skipped.
DROP VIEW consumer_status;
UPDATE consumers c
   SET outbox_id = COALESCE(
           (SELECT pg_catalog.min(o.id) - 1 FROM outbox o
             WHERE (o.inserted_xid, o.id) > (c.outbox_xid, c.outbox_id)),
           (SELECT pg_catalog.max(o.id) FROM outbox o),
           c.outbox_id);
DROP INDEX outbox_commit_order_idx;
ALTER TABLE outbox DROP COLUMN inserted_xid;
ALTER TABLE consumers DROP COLUMN outbox_xid;
ALTER TABLE consumers ADD COLUMN late_id bigint NOT NULL DEFAULT 0;
ALTER TABLE consumers ADD COLUMN version bigint NOT NULL DEFAULT 0;
ALTER TABLE consumer_envelope_cursors ADD COLUMN version bigint NOT NULL DEFAULT 0;
CREATE INDEX consumer_envelope_cursors_version_idx ON consumer_envelope_cursors (consumer, version);

-- Rows a consumer could not deliver because its bus refuses them for good (too
-- large, a subject the bus rejects), set aside after bounded retries so that the
-- rows after them flow. The cursor has moved past them; retry_dead_letters()
-- asks the consumer to try them again.
CREATE TABLE dead_letters (
    id                     bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer               text        NOT NULL REFERENCES consumers (name) ON DELETE CASCADE,
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
    CONSTRAINT dead_letters_row CHECK (
        CASE kind WHEN 'envelope' THEN originator_node_id IS NOT NULL AND originator_sequence_id IS NOT NULL
                                       AND outbox_id IS NULL
                  ELSE outbox_id IS NOT NULL AND originator_node_id IS NULL AND originator_sequence_id IS NULL
        END),
    CONSTRAINT dead_letters_once UNIQUE NULLS NOT DISTINCT
        (consumer, kind, originator_node_id, originator_sequence_id, outbox_id)
);
CREATE INDEX dead_letters_retry_idx ON dead_letters (consumer) WHERE retry_requested_at IS NOT NULL;
COMMENT ON TABLE dead_letters IS
    'Rows a consumer''s bus refused for good, set aside after bounded retries; see retry_dead_letters().';

-- The consumer functions: batches read through the change feed's gate (Rust),
-- acknowledgements that also move the late-feed position, dead letters.
DROP FUNCTION consumer_outbox_batch(text, integer);
DROP FUNCTION consumer_outbox_ack(text, xid8, bigint);
DROP FUNCTION consumer_envelope_batch(text, integer);
DROP FUNCTION consumer_envelope_ack(text, integer[], bigint[]);
DROP FUNCTION consumer_register(text, boolean);

CREATE FUNCTION "consumer_envelope_batch"(
	"consumer" TEXT, /* Option < & str > */
	"batch_size" INT DEFAULT 1000, /* Option < i32 > */
	"batch_bytes" bigint DEFAULT NULL /* Option < i64 > */
) RETURNS TABLE (
	"originator_node_id" INT,  /* i32 */
	"originator_sequence_id" bigint,  /* i64 */
	"gateway_time" timestamp with time zone,  /* TimestampWithTimeZone */
	"topic" bytea,  /* Vec < u8 > */
	"payer_id" INT,  /* Option < i32 > */
	"expiry" bigint,  /* Option < i64 > */
	"originator_envelope" bytea,  /* Vec < u8 > */
	"late_id" bigint  /* Option < i64 > */
)
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'consumer_envelope_batch_wrapper';

CREATE FUNCTION "consumer_outbox_batch"(
	"consumer" TEXT, /* Option < & str > */
	"batch_size" INT DEFAULT 1000, /* Option < i32 > */
	"batch_bytes" bigint DEFAULT NULL /* Option < i64 > */
) RETURNS TABLE (
	"id" bigint,  /* i64 */
	"subject" TEXT,  /* String */
	"payload" bytea,  /* Vec < u8 > */
	"headers" jsonb,  /* JsonB */
	"created_at" timestamp with time zone  /* TimestampWithTimeZone */
)
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'consumer_outbox_batch_wrapper';

CREATE FUNCTION "consumer_register"(
	"name" TEXT, /* Option < & str > */
	"from_start" bool DEFAULT true /* Option < bool > */
) RETURNS void
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'consumer_register_wrapper';

CREATE FUNCTION "consumer_envelopes_pending"(
	"consumer" TEXT /* Option < & str > */
) RETURNS TABLE (
	"pending" bigint,  /* i64 */
	"oldest" timestamp with time zone  /* Option < TimestampWithTimeZone > */
)
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'consumer_envelopes_pending_wrapper';

CREATE FUNCTION "consumer_envelope_ack"(
	"consumer" TEXT, /* Option < & str > */
	"originator_node_ids" INT[], /* :: std :: option :: Option < Array < '_, i32 > > */
	"sequence_ids" bigint[], /* :: std :: option :: Option < Array < '_, i64 > > */
	"late_id" bigint DEFAULT NULL /* Option < i64 > */
) RETURNS bigint /* i64 */
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'consumer_envelope_ack_wrapper';

-- TRUNCATE of meta starts the insert path's high-water marks again.
CREATE FUNCTION "forget_high_water_marks"()
	RETURNS TRIGGER
	LANGUAGE c
	AS 'MODULE_PATHNAME', 'forget_high_water_marks_wrapper';

CREATE TRIGGER forget_high_water_marks AFTER TRUNCATE ON gateway_envelopes_meta
    FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.forget_high_water_marks();

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
    RETURN c;
END $$;

CREATE FUNCTION _check_drawn_position(what text, acked bigint, feed_sequence regclass) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF acked > COALESCE(pg_catalog.pg_sequence_last_value(feed_sequence), 0) THEN
        RAISE EXCEPTION 'cannot acknowledge % %: no such id has been drawn yet', what, acked
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
END $$;

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

CREATE FUNCTION consumer_dead_letter(consumer text, kind text, originator_node_id integer,
                                     originator_sequence_id bigint, outbox_id bigint,
                                     reason text, error text, attempts integer,
                                     first_attempt_at timestamptz DEFAULT NULL)
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
    IF attempts <= 0 THEN
        RAISE EXCEPTION 'attempts must be positive (got %)', attempts USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM @extschema@._lock_consumer(consumer);
    INSERT INTO @extschema@.dead_letters AS d
        (consumer, kind, originator_node_id, originator_sequence_id, outbox_id, reason, error,
         attempts, first_attempt_at, last_attempt_at)
    VALUES (consumer, kind, originator_node_id, originator_sequence_id, outbox_id, reason, error,
            attempts, COALESCE(first_attempt_at, now()), now())
    ON CONFLICT ON CONSTRAINT dead_letters_once DO UPDATE
       SET attempts = d.attempts + EXCLUDED.attempts, reason = EXCLUDED.reason, error = EXCLUDED.error,
           last_attempt_at = now(), retry_requested_at = NULL
    RETURNING d.id INTO new_id;
    RETURN new_id;
END $$;

CREATE FUNCTION retry_dead_letters(consumer text DEFAULT NULL, ids bigint[] DEFAULT NULL)
RETURNS bigint LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH r AS (
        UPDATE @extschema@.dead_letters d SET retry_requested_at = pg_catalog.now()
         WHERE ($1 IS NULL OR d.consumer = $1) AND ($2 IS NULL OR d.id = ANY ($2))
        RETURNING 1)
    SELECT count(*) FROM r
$$;

CREATE FUNCTION consumer_dead_letter_retries(consumer text, batch_size integer DEFAULT 100)
RETURNS TABLE (dead_letter_id bigint, kind text, originator_node_id integer, originator_sequence_id bigint,
               gateway_time timestamptz, topic bytea, payer_id integer, expiry bigint,
               originator_envelope bytea, outbox_id bigint, subject text, payload bytea, headers jsonb,
               created_at timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT EXISTS (SELECT FROM @extschema@.dead_letters d
                    WHERE d.consumer = consumer_dead_letter_retries.consumer
                      AND d.retry_requested_at IS NOT NULL) THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT d.id, d.kind, d.originator_node_id, d.originator_sequence_id,
           v.gateway_time, v.topic, v.payer_id, v.expiry, v.originator_envelope,
           d.outbox_id, o.subject, o.payload, o.headers, o.created_at
      FROM @extschema@.dead_letters d
      LEFT JOIN @extschema@.gateway_envelopes_view v
             ON d.kind = 'envelope' AND v.originator_node_id = d.originator_node_id
            AND v.originator_sequence_id = d.originator_sequence_id
      LEFT JOIN @extschema@.outbox o ON d.kind = 'outbox' AND o.id = d.outbox_id
     WHERE d.consumer = consumer_dead_letter_retries.consumer AND d.retry_requested_at IS NOT NULL
     ORDER BY d.id
     LIMIT batch_size;
END $$;

CREATE FUNCTION consumer_dead_letter_resolved(consumer text, ids bigint[])
RETURNS bigint LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH r AS (
        DELETE FROM @extschema@.dead_letters d WHERE d.consumer = $1 AND d.id = ANY ($2) RETURNING 1)
    SELECT count(*) FROM r
$$;

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
       @extschema@.notification_queue_usage() AS notification_queue_usage
  FROM @extschema@.consumers c
  CROSS JOIN LATERAL (
        SELECT count(*) AS pending, min(ob.created_at) AS oldest
          FROM @extschema@.outbox ob
         WHERE ob.id > c.outbox_id) o
  CROSS JOIN LATERAL @extschema@.consumer_envelopes_pending(c.name) e
  CROSS JOIN LATERAL (
        SELECT count(*) AS dead_letters FROM @extschema@.dead_letters dl WHERE dl.consumer = c.name) d;
COMMENT ON VIEW consumer_status IS 'Consumer positions, what is committed but not yet acknowledged, dead letters and the NOTIFY queue usage.';

-- Retention also removes the late-feed entries of the envelopes it deletes.
CREATE OR REPLACE FUNCTION prune_expired(as_of bigint DEFAULT NULL, lock_timeout_ms integer DEFAULT 200)
RETURNS TABLE (originator_node_id integer, band_start bigint, band_end bigint,
               deleted_rows bigint, dropped boolean)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    cutoff bigint := COALESCE(as_of, EXTRACT(epoch FROM pg_catalog.now())::bigint);
    deleted jsonb := '{}';
    band record;
    empty boolean;
    caller_lock_timeout text := current_setting('lock_timeout');
BEGIN
    IF lock_timeout_ms IS NULL OR lock_timeout_ms <= 0 THEN
        RAISE EXCEPTION 'lock_timeout_ms must be positive (got %)', lock_timeout_ms
              USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- 1. Expired rows, from both tables in one statement, counted per meta band.
    WITH gone AS (
        DELETE FROM @extschema@.gateway_envelopes_meta m
         WHERE m.expiry IS NOT NULL AND m.expiry < cutoff
        RETURNING m.tableoid, m.originator_node_id, m.originator_sequence_id
    ), gone_blob AS (
        DELETE FROM @extschema@.gateway_envelopes_blob b
         USING gone g
         WHERE b.originator_node_id = g.originator_node_id
           AND b.originator_sequence_id = g.originator_sequence_id
    ), gone_late AS (
        DELETE FROM @extschema@.late_envelopes l
         USING gone g
         WHERE l.originator_node_id = g.originator_node_id
           AND l.originator_sequence_id = g.originator_sequence_id
    )
    SELECT COALESCE(jsonb_object_agg(t.leaf::text, t.n), '{}')
      INTO deleted
      FROM (SELECT gone.tableoid::oid AS leaf, count(*) AS n FROM gone GROUP BY 1) t;

    -- 2. Empty bands other than each originator's newest.
    FOR band IN
        SELECT p.*, (p.band_start = max(p.band_start) OVER (PARTITION BY p.originator_node_id)) AS newest
          FROM @extschema@.partitions() p
         ORDER BY p.originator_node_id, p.band_start
    LOOP
        dropped := false;
        IF NOT band.newest AND band.meta_partition IS NOT NULL AND band.blob_partition IS NOT NULL THEN
            EXECUTE format('SELECT NOT EXISTS (SELECT FROM %s) AND NOT EXISTS (SELECT FROM %s)',
                           band.meta_partition, band.blob_partition) INTO empty;
            IF empty THEN
                BEGIN
                    -- A session that just created or found this band and has not
                    -- inserted into it yet keeps it: leave it for next time.
                    IF NOT @extschema@._prune_guard(band.originator_node_id, band.band_start) THEN
                        RAISE EXCEPTION USING ERRCODE = 'object_in_use';
                    END IF;
                    PERFORM set_config('lock_timeout', lock_timeout_ms || 'ms', true);
                    -- Parents first, the order in which inserts lock them.
                    EXECUTE format('LOCK TABLE %s, %s, %s, %s IN ACCESS EXCLUSIVE MODE',
                                   (SELECT i.inhparent::regclass FROM pg_inherits i WHERE i.inhrelid = band.meta_partition),
                                   (SELECT i.inhparent::regclass FROM pg_inherits i WHERE i.inhrelid = band.blob_partition),
                                   band.meta_partition, band.blob_partition);
                    EXECUTE format('SELECT NOT EXISTS (SELECT FROM %s) AND NOT EXISTS (SELECT FROM %s)',
                                   band.meta_partition, band.blob_partition) INTO empty;
                    IF NOT empty THEN
                        -- Rows arrived meanwhile: undo the locks by failing this block.
                        RAISE EXCEPTION USING ERRCODE = 'object_in_use';
                    END IF;
                    EXECUTE format('ALTER TABLE %s DETACH PARTITION %s',
                                   (SELECT i.inhparent::regclass FROM pg_inherits i WHERE i.inhrelid = band.meta_partition),
                                   band.meta_partition);
                    EXECUTE format('ALTER TABLE %s DETACH PARTITION %s',
                                   (SELECT i.inhparent::regclass FROM pg_inherits i WHERE i.inhrelid = band.blob_partition),
                                   band.blob_partition);
                    EXECUTE format('DROP TABLE %s, %s', band.meta_partition, band.blob_partition);
                    dropped := true;
                EXCEPTION WHEN lock_not_available OR object_in_use THEN
                    dropped := false;  -- busy: left for the next run
                END;
            END IF;
        END IF;
        deleted_rows := COALESCE((deleted ->> band.meta_partition::oid::text)::bigint, 0);
        IF dropped OR deleted_rows > 0 THEN
            originator_node_id := band.originator_node_id;
            band_start := band.band_start;
            band_end := band.band_end;
            RETURN NEXT;
        END IF;
    END LOOP;
    PERFORM set_config('lock_timeout', caller_lock_timeout, true);
END
$$;

CREATE OR REPLACE FUNCTION grant_consumer(role name) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM @extschema@.grant_reader(role);
    EXECUTE format('GRANT SELECT ON @extschema@.consumer_status TO %I', role);
    EXECUTE format('GRANT EXECUTE ON FUNCTION
        @extschema@.consumer_register(text, boolean),
        @extschema@.consumer_outbox_batch(text, integer, bigint),
        @extschema@.consumer_outbox_ack(text, bigint),
        @extschema@.consumer_envelope_batch(text, integer, bigint),
        @extschema@.consumer_envelope_ack(text, integer[], bigint[], bigint),
        @extschema@.consumer_dead_letter(text, text, integer, bigint, bigint, text, text, integer, timestamp with time zone),
        @extschema@.consumer_dead_letter_retries(text, integer),
        @extschema@.consumer_dead_letter_resolved(text, bigint[]),
        @extschema@.consumer_envelopes_pending(text),
        @extschema@.notification_queue_usage()
        TO %I', role);
END $$;

CREATE OR REPLACE FUNCTION revoke_consumer(role name) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM @extschema@.revoke_reader(role);
    EXECUTE format('REVOKE SELECT ON @extschema@.consumer_status FROM %I', role);
    EXECUTE format('REVOKE EXECUTE ON FUNCTION
        @extschema@.consumer_register(text, boolean),
        @extschema@.consumer_outbox_batch(text, integer, bigint),
        @extschema@.consumer_outbox_ack(text, bigint),
        @extschema@.consumer_envelope_batch(text, integer, bigint),
        @extschema@.consumer_envelope_ack(text, integer[], bigint[], bigint),
        @extschema@.consumer_dead_letter(text, text, integer, bigint, bigint, text, text, integer, timestamp with time zone),
        @extschema@.consumer_dead_letter_retries(text, integer),
        @extschema@.consumer_dead_letter_resolved(text, bigint[]),
        @extschema@.consumer_envelopes_pending(text),
        @extschema@.notification_queue_usage()
        FROM %I', role);
END $$;

-- As in a fresh install: nothing new is usable by PUBLIC.
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA @extschema@ FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA @extschema@ FROM PUBLIC;

-- Roles made with grant_consumer lost the functions dropped above: give them the
-- new ones. notification_queue_usage() is granted only by grant_consumer and was
-- not dropped, so its grantees are exactly those roles.
SELECT grant_consumer(a.grantee::pg_catalog.regrole::pg_catalog.name)
  FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
 WHERE p.oid = 'notification_queue_usage()'::pg_catalog.regprocedure
   AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner AND a.grantee <> 0;
