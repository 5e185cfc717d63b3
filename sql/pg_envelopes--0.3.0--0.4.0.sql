-- pg_envelopes 0.3.0 -> 0.4.0: hardening. Pruning commits band by band in a
-- worker and never waits for a lock while holding one; consumers and ingress
-- positions belong to the role that made them; dumps restore; new read shapes,
-- the maintenance worker's record and the envelopes_xmtpd schema.
--
-- Released with 0.4.0; never edit it afterwards (scripts/test.sh checks
-- sql/releases/SHA256SUMS). It brings a 0.3.0 database to exactly what a fresh
-- 0.4.0 install creates (tests/tests/upgrade.rs compares the two). Each object is
-- created, changed or dropped once, after what it depends on; the privileges
-- come last, as in a fresh install (sql/privileges.sql).
\echo Use "ALTER EXTENSION pg_envelopes UPDATE TO '0.4.0'" to load this file. \quit

-- ---------------------------------------------------------------------------
-- Owners: a consumer (and an ingress position, below) belongs to the role that
-- made it; only that role, its members and the extension's owner may act for
-- it (src/store/consumer/owner.rs). Consumers made before 0.4.0 have no owner:
-- the first role that acts for one after the upgrade claims it.
-- ---------------------------------------------------------------------------

-- The calling role, and whether it may act for a given owner.
CREATE  FUNCTION "_caller"() RETURNS oid /* pg_sys :: Oid */
STRICT STABLE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_caller_wrapper';
CREATE  FUNCTION "_acts_for"(
	"owner" oid /* pg_sys :: Oid */
) RETURNS bool /* bool */
STRICT STABLE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_acts_for_wrapper';

ALTER TABLE consumers ADD COLUMN owner regrole;

-- Raises 42501 when the calling role may not act for the consumer, and claims an
-- unowned one for it (the Rust rule the batch and acknowledgement functions
-- apply too), with a wrapper taking a consumers row.
CREATE  FUNCTION "_consumer_owner_check"(
	"consumer" TEXT, /* &str */
	"owner" oid /* core::option::Option<pgrx_pg_sys::Oid> */
) RETURNS void
VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_consumer_owner_check_wrapper';
CREATE FUNCTION _check_consumer_owner(c @extschema@.consumers) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp
AS $$ SELECT @extschema@._consumer_owner_check(c.name, c.owner) $$;

-- _lock_consumer checks the owner too: every function that locks a consumer's
-- row (acknowledgements, dead letters) refuses other roles with 42501.
CREATE OR REPLACE FUNCTION _lock_consumer(consumer text) RETURNS @extschema@.consumers
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

-- New: hands a consumer over to another role.
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

-- ---------------------------------------------------------------------------
-- Leases: one active bridge per consumer, and per ingress (name, stream)
-- (src/store/lease.rs). A session takes the lease; the others' acknowledgements
-- and stored positions are refused (55006) while it holds it.
-- ---------------------------------------------------------------------------

CREATE  FUNCTION "_lease_take"(
	"kind" TEXT, /* Option < & str > */
	"name" TEXT, /* Option < & str > */
	"stream" TEXT DEFAULT '' /* Option < & str > */
) RETURNS INT /* Option < i32 > */
VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_lease_take_wrapper';
CREATE  FUNCTION "_lease_release"(
	"kind" TEXT, /* Option < & str > */
	"name" TEXT, /* Option < & str > */
	"stream" TEXT DEFAULT '' /* Option < & str > */
) RETURNS bool /* bool */
VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_lease_release_wrapper';
CREATE  FUNCTION "_lease_check"(
	"kind" TEXT, /* Option < & str > */
	"name" TEXT, /* Option < & str > */
	"stream" TEXT DEFAULT '' /* Option < & str > */
) RETURNS void
VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_lease_check_wrapper';
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

-- ---------------------------------------------------------------------------
-- Ingress positions: per (consumer, stream) instead of per name (a second
-- stream under the same name kept the larger of the two positions and skipped
-- the other stream's messages; each existing row keeps its stream); an owner as
-- consumers have; and the identity of the stream a position counts in (a
-- stream deleted and re-created under the same name numbers from 1 again).
-- ---------------------------------------------------------------------------

ALTER TABLE ingress_positions
    ADD COLUMN owner regrole,
    ADD COLUMN stream_identity text,
    DROP CONSTRAINT ingress_positions_pkey,
    ALTER COLUMN consumer SET NOT NULL,
    ADD CONSTRAINT ingress_positions_pkey PRIMARY KEY (consumer, stream);
COMMENT ON TABLE ingress_positions IS
    'Last bus stream sequence each ingress consumer stored per stream, committed with the envelopes.';

-- NULL or empty names are refused alike by every ingress function.
CREATE FUNCTION _check_ingress_names(consumer text, stream text) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF consumer IS NULL OR stream IS NULL THEN
        RAISE EXCEPTION 'consumer and stream must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF consumer = '' OR stream = '' THEN
        RAISE EXCEPTION 'consumer and stream names must not be empty' USING ERRCODE = 'invalid_parameter_value';
    END IF;
END $$;

-- The position of one stream (0 when none is stored yet).
CREATE OR REPLACE FUNCTION ingress_position(consumer text, stream text)
RETURNS bigint LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM @extschema@._check_ingress_names(consumer, stream);
    RETURN COALESCE((SELECT p.position FROM @extschema@.ingress_positions p
                      WHERE p.consumer = ingress_position.consumer
                        AND p.stream = ingress_position.stream), 0);
END $$;

-- Moves a position forward (never back); 42501 for a position another role
-- owns, 55006 while another session holds the ingress lease.
CREATE OR REPLACE FUNCTION ingress_store_position(consumer text, stream text, new_position bigint)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    moved bigint;
    owner oid;
BEGIN
    PERFORM @extschema@._check_ingress_names(consumer, stream);
    IF new_position IS NULL THEN
        RAISE EXCEPTION 'position must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF new_position < 0 THEN
        RAISE EXCEPTION 'position must not be negative (got %)', new_position USING ERRCODE = 'numeric_value_out_of_range';
    END IF;
    PERFORM @extschema@._lease_check('ingress', consumer, stream);
    INSERT INTO @extschema@.ingress_positions AS p (consumer, stream, position, owner)
    VALUES ($1, $2, $3, @extschema@._caller())
    ON CONFLICT ON CONSTRAINT ingress_positions_pkey
    DO UPDATE SET position = GREATEST(p.position, EXCLUDED.position),
                  updated_at = now(),
                  owner = COALESCE(p.owner, EXCLUDED.owner)
          WHERE p.owner IS NULL OR @extschema@._acts_for(p.owner);
    GET DIAGNOSTICS moved = ROW_COUNT;
    IF moved = 0 THEN
        SELECT p.owner INTO owner FROM @extschema@.ingress_positions p
         WHERE p.consumer = $1 AND p.stream = $2;
        RAISE EXCEPTION 'permission denied for ingress consumer "%" on stream "%"', consumer, stream
              USING ERRCODE = 'insufficient_privilege',
                    HINT = pg_catalog.format('Its position belongs to role %s: only that role (or a member of it) '
                                             'and the extension''s owner may move it.',
                                             owner::pg_catalog.regrole);
    END IF;
END $$;

-- New: the position with the identity of its stream, and the store that takes
-- the identity (a new identity replaces the position, even backwards).
CREATE FUNCTION ingress_stream_position(consumer text, stream text,
                                        OUT "position" bigint, OUT stream_identity text)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT @extschema@._check_ingress_names($1, $2);
    SELECT COALESCE(p.position, 0), p.stream_identity
      FROM (VALUES (1)) AS one (x)
      LEFT JOIN @extschema@.ingress_positions p ON p.consumer = $1 AND p.stream = $2;
$$;
CREATE FUNCTION ingress_store_position(consumer text, stream text, new_position bigint,
                                       stream_identity text)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    moved bigint;
    owner oid;
BEGIN
    PERFORM @extschema@._check_ingress_names(consumer, stream);
    IF new_position IS NULL OR stream_identity IS NULL THEN
        RAISE EXCEPTION 'position and stream identity must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF new_position < 0 THEN
        RAISE EXCEPTION 'position must not be negative (got %)', new_position USING ERRCODE = 'numeric_value_out_of_range';
    END IF;
    IF stream_identity = '' THEN
        RAISE EXCEPTION 'stream identity must not be empty' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM @extschema@._lease_check('ingress', consumer, stream);
    INSERT INTO @extschema@.ingress_positions AS p (consumer, stream, position, owner, stream_identity)
    VALUES ($1, $2, $3, @extschema@._caller(), $4)
    ON CONFLICT ON CONSTRAINT ingress_positions_pkey
    DO UPDATE SET position = CASE WHEN p.stream_identity = EXCLUDED.stream_identity
                                  THEN GREATEST(p.position, EXCLUDED.position)
                                  ELSE EXCLUDED.position END,
                  stream_identity = EXCLUDED.stream_identity,
                  updated_at = now(),
                  owner = COALESCE(p.owner, EXCLUDED.owner)
          WHERE p.owner IS NULL OR @extschema@._acts_for(p.owner);
    GET DIAGNOSTICS moved = ROW_COUNT;
    IF moved = 0 THEN
        SELECT p.owner INTO owner FROM @extschema@.ingress_positions p
         WHERE p.consumer = $1 AND p.stream = $2;
        RAISE EXCEPTION 'permission denied for ingress consumer "%" on stream "%"', consumer, stream
              USING ERRCODE = 'insufficient_privilege',
                    HINT = pg_catalog.format('Its position belongs to role %s: only that role (or a member of it) '
                                             'and the extension''s owner may move it.',
                                             owner::pg_catalog.regrole);
    END IF;
END $$;

-- New: the ingress lease, for the roles that may use the position.
CREATE FUNCTION ingress_lease(consumer text, stream text,
                              OUT acquired boolean, OUT holder_pid integer)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    owner oid;
BEGIN
    PERFORM @extschema@._check_ingress_names(consumer, stream);
    SELECT p.owner INTO owner FROM @extschema@.ingress_positions p
     WHERE p.consumer = ingress_lease.consumer AND p.stream = ingress_lease.stream;
    IF owner IS NOT NULL AND NOT @extschema@._acts_for(owner) THEN
        RAISE EXCEPTION 'permission denied for ingress consumer "%" on stream "%"', consumer, stream
              USING ERRCODE = 'insufficient_privilege',
                    HINT = pg_catalog.format('Its position belongs to role %s: only that role (or a member of it) '
                                             'and the extension''s owner may use it.',
                                             owner::pg_catalog.regrole);
    END IF;
    holder_pid := @extschema@._lease_take('ingress', consumer, stream);
    acquired := holder_pid IS NULL;
END $$;
CREATE FUNCTION ingress_lease_release(consumer text, stream text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM @extschema@._check_ingress_names(consumer, stream);
    RETURN @extschema@._lease_release('ingress', consumer, stream);
END $$;

-- ---------------------------------------------------------------------------
-- The late-envelope feed records a range per (transaction, originator,
-- statement) instead of a row per late envelope (src/store/feed/late.rs).
-- Existing entries keep covering their one row (both new columns NULL). A
-- consumer's late-feed position becomes entry id * 2^24 + how far into the
-- entry it has read (2^24 - 1: all of it), so entry ids stop at 2^39 - 1.
-- ---------------------------------------------------------------------------

ALTER TABLE late_envelopes
    ADD COLUMN last_sequence_id bigint,
    ADD COLUMN inserted_xid xid8,
    ALTER COLUMN id SET MAXVALUE 549755813887;
UPDATE consumers SET late_id = late_id * 16777216 + 16777215 WHERE late_id > 0;

-- ---------------------------------------------------------------------------
-- Dead letters: a refused row is set aside at the first refusal and tried again
-- by the bridge on a short schedule (next_attempt_at), so it no longer holds up
-- the rest of the feed. The foreign key to consumers goes (a trigger replaces
-- it, see "Dumps and restores").
-- ---------------------------------------------------------------------------

ALTER TABLE dead_letters
    ADD COLUMN next_attempt_at timestamptz,
    DROP CONSTRAINT dead_letters_consumer_fkey;
CREATE INDEX dead_letters_next_attempt_idx ON dead_letters (consumer, next_attempt_at)
    WHERE next_attempt_at IS NOT NULL;
COMMENT ON TABLE dead_letters IS
    'Rows a consumer''s bus refused, set aside at once so the rest flows, tried again by the bridge on a short schedule (next_attempt_at) and then kept until retry_dead_letters().';

-- consumer_dead_letter takes next_attempt_at (a new signature: the old one is
-- dropped). Recording a row again adds the attempts and keeps the first
-- attempt's time; an operator's retry request is left alone.
DROP FUNCTION consumer_dead_letter(text, text, integer, bigint, bigint, text, text, integer, timestamp with time zone);
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

-- consumer_dead_letter_retries returns the attempts and whether an operator
-- asked, hands out the rows whose next attempt is due too, and consumes the
-- operator's request as it hands the row out (a new result type, so dropped and
-- created; no longer STABLE).
DROP FUNCTION consumer_dead_letter_retries(text, integer);
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

-- Only for consumers the calling role may act for, and not while another
-- session holds the lease.
CREATE OR REPLACE FUNCTION consumer_dead_letter_resolved(consumer text, ids bigint[])
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

-- New: the dead letters of the consumers the calling role may act for (those
-- without an owner: the extension's owner only).
CREATE FUNCTION consumer_dead_letters(consumer text DEFAULT NULL)
RETURNS SETOF @extschema@.dead_letters LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT d.* FROM @extschema@.dead_letters d
      JOIN @extschema@.consumers c ON c.name = d.consumer
     WHERE ($1 IS NULL OR d.consumer = $1) AND @extschema@._acts_for(COALESCE(c.owner::pg_catalog.oid, 0))
     ORDER BY d.id
$$;

-- retry_dead_letters() only asks for the consumers the calling role may act for
-- (as consumer_dead_letters() shows them).
CREATE OR REPLACE FUNCTION retry_dead_letters(consumer text DEFAULT NULL, ids bigint[] DEFAULT NULL)
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

-- ---------------------------------------------------------------------------
-- Acknowledgements and lag.
-- ---------------------------------------------------------------------------

-- An outbox acknowledgement is refused (55006) while another session holds the
-- consumer's lease.
CREATE OR REPLACE FUNCTION consumer_outbox_ack(consumer text, id bigint)
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

-- New: how many rows a consumer has not acknowledged yet among those it can
-- read now, cheap enough for every round of a bridge.
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

-- consumer_status shows each consumer's owner (a new last column).
CREATE OR REPLACE VIEW consumer_status AS
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

-- ---------------------------------------------------------------------------
-- Bands and pruning: every band is listed from the catalog alone (nothing
-- opened or locked); prune_expired is in Rust and commits band by band, never
-- waiting for a lock while it holds one.
-- ---------------------------------------------------------------------------

CREATE FUNCTION _bands()
RETURNS TABLE (originator_node_id integer, band_start bigint, band_end bigint,
               meta_partition oid, blob_partition oid)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    WITH bands AS (
        SELECT r.kind,
               (pg_catalog.regexp_match(pg_catalog.pg_get_expr(o.relpartbound, o.oid),
                                        '^FOR VALUES IN \((\d+)\)$'))[1]::integer AS node,
               b.oid AS leaf,
               pg_catalog.regexp_match(pg_catalog.pg_get_expr(b.relpartbound, b.oid),
                                       '^FOR VALUES FROM \((.*)\) TO \((.*)\)$') AS bound
          FROM (VALUES ('meta', '@extschema@.gateway_envelopes_meta'::pg_catalog.regclass),
                       ('blob', '@extschema@.gateway_envelopes_blob'::pg_catalog.regclass)) AS r(kind, root)
          JOIN pg_catalog.pg_inherits oi ON oi.inhparent = r.root
          JOIN pg_catalog.pg_class o ON o.oid = oi.inhrelid
          JOIN pg_catalog.pg_inherits bi ON bi.inhparent = o.oid
          JOIN pg_catalog.pg_class b ON b.oid = bi.inhrelid
    ), parsed AS (
        SELECT kind, node, leaf,
               NULLIF(pg_catalog.btrim(bound[1], ''''), 'MINVALUE')::bigint AS lo,
               NULLIF(pg_catalog.btrim(bound[2], ''''), 'MAXVALUE')::bigint AS hi
          FROM bands WHERE bound IS NOT NULL AND node IS NOT NULL
    )
    SELECT COALESCE(m.node, b.node), COALESCE(m.lo, b.lo), COALESCE(m.hi, b.hi), m.leaf, b.leaf
      FROM (SELECT * FROM parsed WHERE kind = 'meta') m
      FULL JOIN (SELECT * FROM parsed WHERE kind = 'blob') b
        ON b.node = m.node AND b.lo IS NOT DISTINCT FROM m.lo AND b.hi IS NOT DISTINCT FROM m.hi
     ORDER BY 1, 2
$$;

-- partitions() lists the bands with _bands(), then adds sizes.
CREATE OR REPLACE FUNCTION partitions()
RETURNS TABLE (originator_node_id integer, band_start bigint, band_end bigint,
               meta_partition regclass, blob_partition regclass,
               row_estimate bigint, total_bytes bigint)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT b.originator_node_id, b.band_start, b.band_end,
           b.meta_partition::pg_catalog.regclass, b.blob_partition::pg_catalog.regclass,
           pg_catalog.pg_stat_get_live_tuples(COALESCE(b.meta_partition, b.blob_partition)),
           COALESCE(pg_catalog.pg_total_relation_size(b.meta_partition), 0)
             + COALESCE(pg_catalog.pg_total_relation_size(b.blob_partition), 0)
      FROM @extschema@._bands() b
     ORDER BY 1, 2
$$;

COMMENT ON FUNCTION partitions() IS
    'Every band partition with its originator, bounds, live-row estimate and size.';

-- prune_expired gains in_transaction (a new signature: the old one is dropped).
DROP FUNCTION @extschema@.prune_expired(bigint, integer);
CREATE  FUNCTION "prune_expired"(
	"as_of" bigint DEFAULT NULL, /* Option < i64 > */
	"lock_timeout_ms" INT DEFAULT 200, /* Option < i32 > */
	"in_transaction" bool DEFAULT false /* Option < bool > */
) RETURNS TABLE (
	"originator_node_id" INT,  /* i32 */
	"band_start" bigint,  /* i64 */
	"band_end" bigint,  /* Option < i64 > */
	"deleted_rows" bigint,  /* i64 */
	"dropped" bool  /* bool */
)
VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'prune_expired_wrapper';

-- New: pruning bounded per originator (below given sequence ids).
CREATE  FUNCTION "prune_expired_below"(
	"originator_node_ids" INT[], /* :: std :: option :: Option < Array < '_, i32 > > */
	"below_sequence_ids" bigint[], /* :: std :: option :: Option < Array < '_, i64 > > */
	"as_of" bigint DEFAULT NULL, /* Option < i64 > */
	"lock_timeout_ms" INT DEFAULT 200, /* Option < i32 > */
	"in_transaction" bool DEFAULT false /* Option < bool > */
) RETURNS TABLE (
	"originator_node_id" INT,  /* i32 */
	"band_start" bigint,  /* i64 */
	"band_end" bigint,  /* Option < i64 > */
	"deleted_rows" bigint,  /* i64 */
	"dropped" bool  /* bool */
)
VOLATILE PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'prune_expired_below_wrapper';

-- New: per originator the highest sequence id ever stored, which pruning does
-- not lower: pruning records what it deleted in pruned_maxima.
CREATE TABLE pruned_maxima (
    originator_node_id     integer     PRIMARY KEY,
    originator_sequence_id bigint      NOT NULL,
    gateway_time           timestamptz NOT NULL
);
COMMENT ON TABLE pruned_maxima IS
    'Per originator, the highest key pruning deleted (so originator_latest() survives pruning).';
CREATE  FUNCTION "_stored_maxima"() RETURNS TABLE (
	"originator_node_id" INT,  /* i32 */
	"originator_sequence_id" bigint,  /* i64 */
	"gateway_time" timestamp with time zone  /* TimestampWithTimeZone */
)
STRICT STABLE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_stored_maxima_wrapper';
CREATE FUNCTION originator_latest()
RETURNS TABLE (originator_node_id integer, originator_sequence_id bigint,
               gateway_time timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT DISTINCT ON (x.node) x.node, x.seq, x.at
      FROM (SELECT s.originator_node_id, s.originator_sequence_id, s.gateway_time
              FROM @extschema@._stored_maxima() s
            UNION ALL
            SELECT p.originator_node_id, p.originator_sequence_id, p.gateway_time
              FROM @extschema@.pruned_maxima p) AS x(node, seq, at)
     ORDER BY x.node, x.seq DESC
$$;
COMMENT ON FUNCTION originator_latest() IS
    'Per originator, the highest sequence id ever stored (surviving pruning) and its gateway time.';

-- orphaned_envelopes() reads band by band in Rust (the SQL anti-join locked
-- every band at once and ran out of lock table at a few thousand bands); a new
-- result type, so dropped and created.
DROP FUNCTION @extschema@.orphaned_envelopes();
CREATE  FUNCTION "orphaned_envelopes"() RETURNS TABLE (
	"originator_node_id" INT,  /* i32 */
	"originator_sequence_id" bigint,  /* i64 */
	"missing_from" TEXT  /* String */
)
STRICT STABLE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'orphaned_envelopes_wrapper';

-- New: the store's originators and bands against the size of the lock table.
CREATE  FUNCTION "store_size"() RETURNS TABLE (
	"originators" bigint,  /* i64 */
	"bands" bigint,  /* i64 */
	"whole_store_locks" bigint,  /* i64 */
	"lock_table_size" bigint,  /* i64 */
	"max_locks_per_transaction" bigint  /* i64 */
)
STRICT STABLE SECURITY DEFINER PARALLEL SAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'store_size_wrapper';

-- New: the maintenance worker's record. Where pg_envelopes is in
-- shared_preload_libraries, a background worker prunes and creates bands ahead
-- (src/store/maintenance/) and records each run here; maintenance_status()
-- shows the newest.
CREATE TABLE maintenance_runs (
    run_id        bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    started       timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
    finished      timestamptz,
    bands_dropped bigint      NOT NULL DEFAULT 0,
    bands_created bigint      NOT NULL DEFAULT 0,
    rows_deleted  bigint      NOT NULL DEFAULT 0,
    error         text
);
COMMENT ON TABLE maintenance_runs IS
    'Runs of the maintenance worker (pruning, bands created ahead) in this database, newest 1,000.';
CREATE FUNCTION maintenance_status(max_runs integer DEFAULT 10)
RETURNS TABLE (run_id bigint, started timestamptz, finished timestamptz,
               duration interval, bands_dropped bigint, bands_created bigint,
               rows_deleted bigint, error text)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT r.run_id, r.started, r.finished, r.finished - r.started,
           r.bands_dropped, r.bands_created, r.rows_deleted, r.error
      FROM @extschema@.maintenance_runs r
     ORDER BY r.run_id DESC
     LIMIT GREATEST(max_runs, 0)
$$;
COMMENT ON FUNCTION maintenance_status(integer) IS
    'The newest runs of the maintenance worker in this database, newest first.';

-- ---------------------------------------------------------------------------
-- Writes.
-- ---------------------------------------------------------------------------

-- The insert functions lose SET search_path, which Postgres applies on every
-- call: their hot path runs no SQL, and what does pins the path itself.
ALTER FUNCTION @extschema@.insert_gateway_envelope(integer, bigint, bytea, bytea, integer,
    timestamp with time zone, bigint) RESET search_path;
ALTER FUNCTION @extschema@.insert_gateway_envelopes(integer[], bigint[], bytea[], bytea[], integer[],
    timestamp with time zone[], bigint[]) RESET search_path;

-- New: the packed forms pg_envelopes_router sends a shard (one originator's
-- rows in one base64 value), and a batch insert returning the keys it stored.
CREATE FUNCTION insert_gateway_envelopes_packed(originator_node_id integer, packed_rows text)
RETURNS bigint VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'insert_gateway_envelopes_packed_wrapper';
CREATE FUNCTION insert_gateway_envelope_packed(originator_node_id integer, packed_row text)
RETURNS bigint VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'insert_gateway_envelope_packed_wrapper';
CREATE  FUNCTION "insert_gateway_envelopes_keys"(
	"originator_node_ids" INT[], /* :: std :: option :: Option < Array < '_, i32 > > */
	"originator_sequence_ids" bigint[], /* :: std :: option :: Option < Array < '_, i64 > > */
	"topics" bytea[], /* :: std :: option :: Option < Array < '_, & [u8] > > */
	"originator_envelopes" bytea[], /* :: std :: option :: Option < Array < '_, & [u8] > > */
	"payer_ids" INT[] DEFAULT NULL, /* :: std :: option :: Option < Array < '_, i32 > > */
	"gateway_times" timestamp with time zone[] DEFAULT NULL, /* :: std :: option :: Option < Array < '_, TimestampWithTimeZone > > */
	"expiries" bigint[] DEFAULT NULL /* :: std :: option :: Option < Array < '_, i64 > > */
) RETURNS TABLE (
	"originator_node_id" INT,  /* i32 */
	"originator_sequence_id" bigint  /* i64 */
)
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'insert_gateway_envelopes_keys_wrapper';

-- ---------------------------------------------------------------------------
-- Reads.
-- ---------------------------------------------------------------------------

-- The vector-clock selector runs no SQL: no longer SECURITY DEFINER with a
-- pinned search_path (set up again for every row); EXECUTE is what it needs.
ALTER FUNCTION select_gateway_envelopes(integer[], bigint[], bytea[], integer[], integer)
    SECURITY INVOKER RESET ALL;

-- New: the read shapes of an xmtpd node (src/store/read/shapes.rs).
CREATE  FUNCTION "originator_maxima"(
	"originator_node_ids" INT[] /* :: std :: option :: Option < Array < '_, i32 > > */
) RETURNS TABLE (
	"originator_node_id" INT,  /* i32 */
	"max_sequence_id" bigint  /* i64 */
)
STABLE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'originator_maxima_wrapper';
CREATE  FUNCTION "select_by_topic_cursors"(
	"cursor_topics" bytea[], /* :: std :: option :: Option < Array < '_, & [u8] > > */
	"cursor_node_ids" INT[], /* :: std :: option :: Option < Array < '_, i32 > > */
	"cursor_sequence_ids" bigint[], /* :: std :: option :: Option < Array < '_, i64 > > */
	"rows_per_entry" INT DEFAULT 1000, /* Option < i32 > */
	"row_limit" INT DEFAULT 1000, /* Option < i32 > */
	"commit_safe" bool DEFAULT false /* Option < bool > */
) RETURNS TABLE (
	"originator_node_id" INT,  /* i32 */
	"originator_sequence_id" bigint,  /* i64 */
	"gateway_time" timestamp with time zone,  /* TimestampWithTimeZone */
	"topic" bytea,  /* Vec < u8 > */
	"payer_id" INT,  /* Option < i32 > */
	"expiry" bigint,  /* Option < i64 > */
	"originator_envelope" bytea  /* Vec < u8 > */
)
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'select_by_topic_cursors_wrapper';
CREATE  FUNCTION "select_newest_by_topic"(
	"topics" bytea[] /* :: std :: option :: Option < Array < '_, & [u8] > > */
) RETURNS TABLE (
	"originator_node_id" INT,  /* i32 */
	"originator_sequence_id" bigint,  /* i64 */
	"gateway_time" timestamp with time zone,  /* TimestampWithTimeZone */
	"topic" bytea,  /* Vec < u8 > */
	"payer_id" INT,  /* Option < i32 > */
	"expiry" bigint,  /* Option < i64 > */
	"originator_envelope" bytea  /* Vec < u8 > */
)
STABLE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'select_newest_by_topic_wrapper';
CREATE  FUNCTION "select_originator"(
	"originator_node_id" INT, /* Option < i32 > */
	"after_sequence_id" bigint DEFAULT 0, /* Option < i64 > */
	"row_limit" INT DEFAULT 1000, /* Option < i32 > */
	"commit_safe" bool DEFAULT false /* Option < bool > */
) RETURNS TABLE (
	"originator_node_id" INT,  /* i32 */
	"originator_sequence_id" bigint,  /* i64 */
	"gateway_time" timestamp with time zone,  /* TimestampWithTimeZone */
	"topic" bytea,  /* Vec < u8 > */
	"payer_id" INT,  /* Option < i32 > */
	"expiry" bigint,  /* Option < i64 > */
	"originator_envelope" bytea  /* Vec < u8 > */
)
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'select_originator_wrapper';
CREATE  FUNCTION "select_wave"(
	"cursor_topics" bytea[], /* :: std :: option :: Option < Array < '_, & [u8] > > */
	"cursor_node_ids" INT[], /* :: std :: option :: Option < Array < '_, i32 > > */
	"cursor_sequence_ids" bigint[], /* :: std :: option :: Option < Array < '_, i64 > > */
	"ceiling_node_ids" INT[], /* :: std :: option :: Option < Array < '_, i32 > > */
	"ceiling_sequence_ids" bigint[], /* :: std :: option :: Option < Array < '_, i64 > > */
	"after_node_id" INT DEFAULT NULL, /* Option < i32 > */
	"after_sequence_id" bigint DEFAULT NULL, /* Option < i64 > */
	"row_limit" INT DEFAULT 1000, /* Option < i32 > */
	"commit_safe" bool DEFAULT false /* Option < bool > */
) RETURNS TABLE (
	"originator_node_id" INT,  /* i32 */
	"originator_sequence_id" bigint,  /* i64 */
	"gateway_time" timestamp with time zone,  /* TimestampWithTimeZone */
	"topic" bytea,  /* Vec < u8 > */
	"payer_id" INT,  /* Option < i32 > */
	"expiry" bigint,  /* Option < i64 > */
	"originator_envelope" bytea  /* Vec < u8 > */
)
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'select_wave_wrapper';

-- gateway_envelopes_view looks each meta row's bytes up by key instead of
-- joining blob (src/store/read/lookup.rs): same columns, same rows.
-- envelope_of runs as the caller of the view, so grant_reader grants it.
CREATE FUNCTION envelope_of(originator_node_id integer, originator_sequence_id bigint)
RETURNS bytea STRICT STABLE PARALLEL SAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'envelope_of_wrapper';
CREATE OR REPLACE VIEW gateway_envelopes_view AS
SELECT m.originator_node_id,
       m.originator_sequence_id,
       m.gateway_time,
       m.topic,
       m.payer_id,
       m.expiry,
       b.originator_envelope
  FROM gateway_envelopes_meta m
 CROSS JOIN LATERAL (
       SELECT envelope_of(m.originator_node_id, m.originator_sequence_id) AS originator_envelope
       OFFSET 0) b
 WHERE b.originator_envelope IS NOT NULL;
COMMENT ON VIEW gateway_envelopes_view IS
    'Envelopes with their bytes: each meta row with its blob row, looked up by key.';

-- ---------------------------------------------------------------------------
-- Replication: every standby's flush position for egress's
-- --forward-after standby-flush (pg_stat_replication hides other users' LSNs
-- from a consumer role). No addresses, no process ids.
-- ---------------------------------------------------------------------------

CREATE FUNCTION standby_flush_positions()
RETURNS TABLE (application_name text, state text, sync_state text, flush_lsn pg_lsn)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
    SELECT r.application_name::text, r.state, r.sync_state, r.flush_lsn
      FROM pg_catalog.pg_stat_replication r
$$;

-- ---------------------------------------------------------------------------
-- envelopes_xmtpd: the store as xmtpd's queries see it, one function per xmtpd
-- query with its name, parameters, columns and answers. Plain SQL over the
-- functions above, run as the caller (sql/xmtpd.sql explains the design).
-- ---------------------------------------------------------------------------

CREATE SCHEMA envelopes_xmtpd;
COMMENT ON SCHEMA envelopes_xmtpd IS
    'pg_envelopes as xmtpd''s queries see it: their names, parameters, columns and answers.';

-- Whether the input is one the strict functions take as it is (no NULL, no
-- repeats, lengths equal), and a limit they take.
CREATE FUNCTION envelopes_xmtpd._plain_cursor(node_ids integer[], sequence_ids bigint[])
RETURNS boolean LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN node_ids IS NOT NULL AND sequence_ids IS NOT NULL
       AND pg_catalog.cardinality(node_ids) = pg_catalog.cardinality(sequence_ids)
       AND pg_catalog.array_position(node_ids, NULL) IS NULL
       AND pg_catalog.array_position(sequence_ids, NULL) IS NULL
       AND (SELECT pg_catalog.count(DISTINCT n) FROM pg_catalog.unnest(node_ids) AS n)
           = pg_catalog.cardinality(node_ids);
END $$;
CREATE FUNCTION envelopes_xmtpd._plain_entries(topics bytea[], node_ids integer[], sequence_ids bigint[])
RETURNS boolean LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN topics IS NOT NULL AND node_ids IS NOT NULL AND sequence_ids IS NOT NULL
       AND pg_catalog.cardinality(topics) = pg_catalog.cardinality(node_ids)
       AND pg_catalog.cardinality(node_ids) = pg_catalog.cardinality(sequence_ids)
       AND pg_catalog.array_position(topics, NULL) IS NULL
       AND pg_catalog.array_position(node_ids, NULL) IS NULL
       AND pg_catalog.array_position(sequence_ids, NULL) IS NULL
       AND (SELECT pg_catalog.count(DISTINCT (t, n))
              FROM ROWS FROM (pg_catalog.unnest(topics), pg_catalog.unnest(node_ids)) AS e(t, n))
           = pg_catalog.cardinality(topics);
END $$;
CREATE FUNCTION envelopes_xmtpd._plain_topics(topics bytea[])
RETURNS boolean LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN topics IS NOT NULL
       AND pg_catalog.array_position(topics, NULL) IS NULL
       AND (SELECT pg_catalog.count(DISTINCT t) FROM pg_catalog.unnest(topics) AS t)
           = pg_catalog.cardinality(topics);
END $$;
CREATE FUNCTION envelopes_xmtpd._limit(row_limit integer, zero_is_all boolean)
RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN row_limit IS NULL OR (row_limit = 0 AND zero_is_all) THEN 2147483647
                WHEN row_limit < 0 THEN 0
                ELSE row_limit END
$$;

-- The readers, each with the helper that reads any other input entry by entry.
CREATE FUNCTION envelopes_xmtpd.select_gateway_envelopes_by_single_originator(
    p_originator_node_id integer, cursor_sequence_id bigint, row_limit integer)
RETURNS TABLE (originator_node_id integer, originator_sequence_id bigint,
               gateway_time timestamp, topic bytea, originator_envelope bytea)
LANGUAGE sql STABLE
AS $$
    SELECT r.originator_node_id, r.originator_sequence_id,
           pg_catalog.timezone(INTERVAL '0', r.gateway_time), r.topic, r.originator_envelope
      FROM @extschema@.select_originator(p_originator_node_id, cursor_sequence_id,
                                         envelopes_xmtpd._limit(row_limit, true)) AS r
     WHERE p_originator_node_id IS NOT NULL AND cursor_sequence_id IS NOT NULL
     LIMIT NULLIF(row_limit, 0)
$$;
CREATE FUNCTION envelopes_xmtpd._by_originators_by_entries(
    cursor_node_ids integer[], cursor_sequence_ids bigint[], row_limit integer)
RETURNS TABLE (originator_node_id integer, originator_sequence_id bigint,
               gateway_time timestamp, topic bytea, originator_envelope bytea)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT r.originator_node_id, r.originator_sequence_id,
           pg_catalog.timezone(INTERVAL '0', r.gateway_time), r.topic, r.originator_envelope
      FROM ROWS FROM (pg_catalog.unnest(cursor_node_ids), pg_catalog.unnest(cursor_sequence_ids)) AS e(node, seq)
     CROSS JOIN LATERAL @extschema@.select_originator(e.node, e.seq,
                                                      envelopes_xmtpd._limit(row_limit, true)) AS r
     WHERE e.node IS NOT NULL AND e.seq IS NOT NULL
     ORDER BY r.originator_node_id, r.originator_sequence_id
     LIMIT NULLIF(row_limit, 0)
$$;
CREATE FUNCTION envelopes_xmtpd.select_gateway_envelopes_by_originators(
    cursor_node_ids integer[], cursor_sequence_ids bigint[], row_limit integer)
RETURNS TABLE (originator_node_id integer, originator_sequence_id bigint,
               gateway_time timestamp, topic bytea, originator_envelope bytea)
LANGUAGE sql STABLE
AS $$
    (SELECT r.originator_node_id, r.originator_sequence_id,
            pg_catalog.timezone(INTERVAL '0', r.gateway_time), r.topic, r.originator_envelope
       FROM @extschema@.select_gateway_envelopes(cursor_node_ids, cursor_sequence_ids, NULL,
                                                 cursor_node_ids,
                                                 envelopes_xmtpd._limit(row_limit, true)) AS r
      WHERE envelopes_xmtpd._plain_cursor(cursor_node_ids, cursor_sequence_ids)
      LIMIT NULLIF(row_limit, 0))
    UNION ALL
    (SELECT * FROM envelopes_xmtpd._by_originators_by_entries(cursor_node_ids, cursor_sequence_ids, row_limit)
      WHERE NOT envelopes_xmtpd._plain_cursor(cursor_node_ids, cursor_sequence_ids)
      LIMIT NULLIF(row_limit, 0))
$$;
CREATE FUNCTION envelopes_xmtpd._by_topics_by_entries(
    cursor_node_ids integer[], cursor_sequence_ids bigint[], topics bytea[], row_limit integer)
RETURNS TABLE (originator_node_id integer, originator_sequence_id bigint,
               gateway_time timestamp, topic bytea, originator_envelope bytea)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT r.originator_node_id, r.originator_sequence_id,
           pg_catalog.timezone(INTERVAL '0', r.gateway_time), r.topic, r.originator_envelope
      FROM pg_catalog.unnest(topics) AS t(topic)
     CROSS JOIN ROWS FROM (pg_catalog.unnest(cursor_node_ids), pg_catalog.unnest(cursor_sequence_ids)) AS e(node, seq)
     CROSS JOIN LATERAL @extschema@.select_by_topic_cursors(
               ARRAY[t.topic], ARRAY[e.node], ARRAY[e.seq],
               envelopes_xmtpd._limit(row_limit, false),
               envelopes_xmtpd._limit(row_limit, false)) AS r
     WHERE t.topic IS NOT NULL AND e.node IS NOT NULL AND e.seq IS NOT NULL
     ORDER BY r.originator_node_id, r.originator_sequence_id
     LIMIT row_limit
$$;
CREATE FUNCTION envelopes_xmtpd.select_gateway_envelopes_by_topics(
    cursor_node_ids integer[], cursor_sequence_ids bigint[], topics bytea[], row_limit integer)
RETURNS TABLE (originator_node_id integer, originator_sequence_id bigint,
               gateway_time timestamp, topic bytea, originator_envelope bytea)
LANGUAGE sql STABLE
AS $$
    (SELECT r.originator_node_id, r.originator_sequence_id,
            pg_catalog.timezone(INTERVAL '0', r.gateway_time), r.topic, r.originator_envelope
       FROM @extschema@.select_gateway_envelopes(cursor_node_ids, cursor_sequence_ids, topics,
                                                 cursor_node_ids,
                                                 envelopes_xmtpd._limit(row_limit, false)) AS r
      WHERE envelopes_xmtpd._plain_cursor(cursor_node_ids, cursor_sequence_ids)
        AND envelopes_xmtpd._plain_topics(topics)
      LIMIT row_limit)
    UNION ALL
    (SELECT * FROM envelopes_xmtpd._by_topics_by_entries(cursor_node_ids, cursor_sequence_ids, topics, row_limit)
      WHERE NOT (envelopes_xmtpd._plain_cursor(cursor_node_ids, cursor_sequence_ids)
                 AND envelopes_xmtpd._plain_topics(topics))
      LIMIT row_limit)
$$;
CREATE FUNCTION envelopes_xmtpd._unfiltered_by_entries(
    cursor_node_ids integer[], cursor_sequence_ids bigint[], row_limit integer)
RETURNS TABLE (originator_node_id integer, originator_sequence_id bigint,
               gateway_time timestamp, topic bytea, originator_envelope bytea)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    WITH e AS (
        SELECT u.node, COALESCE(u.seq, 0) AS seq
          FROM ROWS FROM (pg_catalog.unnest(cursor_node_ids), pg_catalog.unnest(cursor_sequence_ids)) AS u(node, seq)
         WHERE u.node IS NOT NULL
    ), lowest AS (
        SELECT e.node, pg_catalog.min(e.seq) AS seq FROM e GROUP BY e.node
    )
    SELECT r.originator_node_id, r.originator_sequence_id,
           pg_catalog.timezone(INTERVAL '0', r.gateway_time), r.topic, r.originator_envelope
      FROM @extschema@.select_gateway_envelopes(
               COALESCE((SELECT pg_catalog.array_agg(l.node) FROM lowest l), '{}'),
               COALESCE((SELECT pg_catalog.array_agg(l.seq) FROM lowest l), '{}'),
               NULL, NULL, envelopes_xmtpd._limit(row_limit, true)) AS r
     CROSS JOIN LATERAL pg_catalog.generate_series(1,
               CASE WHEN EXISTS (SELECT FROM e WHERE e.node = r.originator_node_id)
                    THEN (SELECT pg_catalog.count(*) FROM e
                           WHERE e.node = r.originator_node_id
                             AND r.originator_sequence_id > e.seq)
                    ELSE 1 END) AS copies
     LIMIT NULLIF(row_limit, 0)
$$;
CREATE FUNCTION envelopes_xmtpd.select_gateway_envelopes_unfiltered(
    cursor_node_ids integer[], cursor_sequence_ids bigint[], row_limit integer)
RETURNS TABLE (originator_node_id integer, originator_sequence_id bigint,
               gateway_time timestamp, topic bytea, originator_envelope bytea)
LANGUAGE sql STABLE
AS $$
    (SELECT r.originator_node_id, r.originator_sequence_id,
            pg_catalog.timezone(INTERVAL '0', r.gateway_time), r.topic, r.originator_envelope
       FROM @extschema@.select_gateway_envelopes(cursor_node_ids, cursor_sequence_ids, NULL, NULL,
                                                 envelopes_xmtpd._limit(row_limit, true)) AS r
      WHERE envelopes_xmtpd._plain_cursor(cursor_node_ids, cursor_sequence_ids)
      LIMIT NULLIF(row_limit, 0))
    UNION ALL
    (SELECT * FROM envelopes_xmtpd._unfiltered_by_entries(cursor_node_ids, cursor_sequence_ids, row_limit)
      WHERE NOT envelopes_xmtpd._plain_cursor(cursor_node_ids, cursor_sequence_ids)
      LIMIT NULLIF(row_limit, 0))
$$;
CREATE FUNCTION envelopes_xmtpd._per_topic_by_entries(
    cursor_topics bytea[], cursor_node_ids integer[], cursor_sequence_ids bigint[],
    rows_per_entry integer, row_limit integer)
RETURNS TABLE (originator_node_id integer, originator_sequence_id bigint,
               gateway_time timestamp, topic bytea, originator_envelope bytea)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT r.originator_node_id, r.originator_sequence_id,
           pg_catalog.timezone(INTERVAL '0', r.gateway_time), r.topic, r.originator_envelope
      FROM ROWS FROM (pg_catalog.unnest(cursor_topics), pg_catalog.unnest(cursor_node_ids), pg_catalog.unnest(cursor_sequence_ids)) AS e(topic, node, seq)
     CROSS JOIN LATERAL (
           SELECT s.* FROM @extschema@.select_by_topic_cursors(
                      ARRAY[e.topic], ARRAY[e.node], ARRAY[e.seq],
                      envelopes_xmtpd._limit(rows_per_entry, false),
                      envelopes_xmtpd._limit(rows_per_entry, false)) AS s
            LIMIT rows_per_entry) AS r
     WHERE e.topic IS NOT NULL AND e.node IS NOT NULL AND e.seq IS NOT NULL
     ORDER BY r.originator_node_id, r.originator_sequence_id
     LIMIT NULLIF(row_limit, 0)
$$;
CREATE FUNCTION envelopes_xmtpd.select_gateway_envelopes_by_per_topic_cursors(
    cursor_topics bytea[], cursor_node_ids integer[], cursor_sequence_ids bigint[],
    rows_per_entry integer, row_limit integer)
RETURNS TABLE (originator_node_id integer, originator_sequence_id bigint,
               gateway_time timestamp, topic bytea, originator_envelope bytea)
LANGUAGE sql STABLE
AS $$
    (SELECT r.originator_node_id, r.originator_sequence_id,
            pg_catalog.timezone(INTERVAL '0', r.gateway_time), r.topic, r.originator_envelope
       FROM @extschema@.select_by_topic_cursors(cursor_topics, cursor_node_ids, cursor_sequence_ids,
                                                envelopes_xmtpd._limit(rows_per_entry, false),
                                                envelopes_xmtpd._limit(row_limit, true)) AS r
      WHERE envelopes_xmtpd._plain_entries(cursor_topics, cursor_node_ids, cursor_sequence_ids)
        AND (rows_per_entry IS NULL OR rows_per_entry >= 0)
      LIMIT NULLIF(row_limit, 0))
    UNION ALL
    (SELECT * FROM envelopes_xmtpd._per_topic_by_entries(cursor_topics, cursor_node_ids,
                                                         cursor_sequence_ids, rows_per_entry, row_limit)
      WHERE NOT (envelopes_xmtpd._plain_entries(cursor_topics, cursor_node_ids, cursor_sequence_ids)
                 AND (rows_per_entry IS NULL OR rows_per_entry >= 0))
      LIMIT NULLIF(row_limit, 0))
$$;
CREATE FUNCTION envelopes_xmtpd._wave_by_entries(
    cursor_topics bytea[], cursor_node_ids integer[], cursor_sequence_ids bigint[],
    ceiling_node_ids integer[], ceiling_sequence_ids bigint[],
    scan_node_id integer, scan_sequence_id bigint, row_limit integer)
RETURNS TABLE (originator_node_id integer, originator_sequence_id bigint,
               gateway_time timestamp, topic bytea, originator_envelope bytea)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT r.originator_node_id, r.originator_sequence_id,
           pg_catalog.timezone(INTERVAL '0', r.gateway_time), r.topic, r.originator_envelope
      FROM ROWS FROM (pg_catalog.unnest(cursor_topics), pg_catalog.unnest(cursor_node_ids), pg_catalog.unnest(cursor_sequence_ids)) AS e(topic, node, seq)
      JOIN ROWS FROM (pg_catalog.unnest(ceiling_node_ids), pg_catalog.unnest(ceiling_sequence_ids)) AS c(node, seq)
        ON c.node = e.node
     CROSS JOIN LATERAL @extschema@.select_wave(
               ARRAY[e.topic], ARRAY[e.node], ARRAY[e.seq], ARRAY[c.node], ARRAY[c.seq],
               scan_node_id, COALESCE(scan_sequence_id, 9223372036854775807),
               envelopes_xmtpd._limit(row_limit, false)) AS r
     WHERE scan_node_id IS NOT NULL
       AND e.topic IS NOT NULL AND e.seq IS NOT NULL AND c.seq IS NOT NULL
     ORDER BY r.originator_node_id, r.originator_sequence_id
     LIMIT row_limit
$$;
CREATE FUNCTION envelopes_xmtpd.select_gateway_envelopes_wave_scan(
    cursor_topics bytea[], cursor_node_ids integer[], cursor_sequence_ids bigint[],
    ceiling_node_ids integer[], ceiling_sequence_ids bigint[],
    scan_node_id integer, scan_sequence_id bigint, row_limit integer)
RETURNS TABLE (originator_node_id integer, originator_sequence_id bigint,
               gateway_time timestamp, topic bytea, originator_envelope bytea)
LANGUAGE sql STABLE
AS $$
    (SELECT r.originator_node_id, r.originator_sequence_id,
            pg_catalog.timezone(INTERVAL '0', r.gateway_time), r.topic, r.originator_envelope
       FROM @extschema@.select_wave(cursor_topics, cursor_node_ids, cursor_sequence_ids,
                                    ceiling_node_ids, ceiling_sequence_ids,
                                    scan_node_id, scan_sequence_id,
                                    envelopes_xmtpd._limit(row_limit, false)) AS r
      WHERE envelopes_xmtpd._plain_entries(cursor_topics, cursor_node_ids, cursor_sequence_ids)
        AND envelopes_xmtpd._plain_cursor(ceiling_node_ids, ceiling_sequence_ids)
        AND scan_node_id IS NOT NULL AND scan_sequence_id IS NOT NULL
      LIMIT row_limit)
    UNION ALL
    (SELECT * FROM envelopes_xmtpd._wave_by_entries(cursor_topics, cursor_node_ids, cursor_sequence_ids,
                                                    ceiling_node_ids, ceiling_sequence_ids,
                                                    scan_node_id, scan_sequence_id, row_limit)
      WHERE NOT (envelopes_xmtpd._plain_entries(cursor_topics, cursor_node_ids, cursor_sequence_ids)
                 AND envelopes_xmtpd._plain_cursor(ceiling_node_ids, ceiling_sequence_ids)
                 AND scan_node_id IS NOT NULL AND scan_sequence_id IS NOT NULL)
      LIMIT row_limit)
$$;
CREATE FUNCTION envelopes_xmtpd.select_newest_from_topics(topics bytea[])
RETURNS TABLE (originator_node_id integer, originator_sequence_id bigint,
               gateway_time timestamp, topic bytea, originator_envelope bytea)
LANGUAGE sql STABLE
AS $$
    SELECT r.originator_node_id, r.originator_sequence_id,
           pg_catalog.timezone(INTERVAL '0', r.gateway_time), r.topic, r.originator_envelope
      FROM @extschema@.select_newest_by_topic(
               pg_catalog.array_remove(COALESCE(topics, '{}'), NULL)) AS r
$$;
CREATE FUNCTION envelopes_xmtpd.select_originator_ceilings(node_ids integer[])
RETURNS TABLE (originator_node_id integer, max_sequence_id bigint)
LANGUAGE sql STABLE
AS $$
    SELECT o.node, COALESCE(m.max_sequence_id, 0)
      FROM pg_catalog.unnest(node_ids) WITH ORDINALITY AS o(node, ord)
      LEFT JOIN @extschema@.originator_maxima(
                    pg_catalog.array_remove(COALESCE(node_ids, '{}'), NULL)) AS m
        ON m.originator_node_id = o.node
     ORDER BY o.ord
$$;
CREATE FUNCTION envelopes_xmtpd.select_vector_clock()
RETURNS TABLE (originator_node_id integer, originator_sequence_id bigint, gateway_time timestamp)
LANGUAGE sql STABLE
AS $$
    SELECT l.originator_node_id, l.originator_sequence_id, pg_catalog.timezone(INTERVAL '0', l.gateway_time)
      FROM @extschema@.originator_latest() AS l
     ORDER BY l.originator_node_id
$$;
CREATE FUNCTION envelopes_xmtpd.get_latest_sequence_id(p_originator_node_id integer)
RETURNS bigint
LANGUAGE sql STABLE
AS $$
    SELECT COALESCE((SELECT l.originator_sequence_id FROM @extschema@.originator_latest() AS l
                      WHERE l.originator_node_id = p_originator_node_id), 0)
$$;
CREATE FUNCTION envelopes_xmtpd.select_originator_node_ids()
RETURNS SETOF integer
LANGUAGE sql STABLE
AS $$
    SELECT l.originator_node_id FROM @extschema@.originator_latest() AS l
     ORDER BY l.originator_node_id
$$;

-- The writers, and pruning below xmtpd's settled payer reports.
CREATE FUNCTION envelopes_xmtpd.ensure_gateway_parts_v3(
    p_originator_node_id integer, p_originator_sequence_id bigint, p_band_width bigint)
RETURNS void
LANGUAGE sql VOLATILE
AS $$
    SELECT @extschema@.ensure_gateway_parts(p_originator_node_id, p_originator_sequence_id,
                                            p_band_width)
$$;
CREATE FUNCTION envelopes_xmtpd.insert_gateway_envelope_v3(
    p_originator_node_id integer, p_originator_sequence_id bigint, p_topic bytea,
    p_payer_id integer, p_gateway_time timestamp, p_expiry bigint, p_originator_envelope bytea)
RETURNS TABLE (inserted_meta_rows bigint, inserted_blob_rows bigint, total_inserted_rows bigint)
LANGUAGE sql VOLATILE
AS $$
    SELECT n, n, 2 * n
      FROM @extschema@.insert_gateway_envelope(
               p_originator_node_id, p_originator_sequence_id, p_topic, p_originator_envelope,
               p_payer_id, pg_catalog.timezone(INTERVAL '0', p_gateway_time), p_expiry) AS n
$$;
CREATE FUNCTION envelopes_xmtpd.insert_gateway_envelope_batch(
    p_originator_node_ids integer[], p_originator_sequence_ids bigint[], p_topics bytea[],
    p_payer_ids integer[], p_gateway_times timestamp[], p_expiries bigint[],
    p_originator_envelopes bytea[])
RETURNS TABLE (originator_node_id integer, originator_sequence_id bigint,
               payer_id integer, gateway_time timestamp)
LANGUAGE sql VOLATILE
AS $$
    WITH new AS (
        SELECT k.originator_node_id, k.originator_sequence_id
          FROM @extschema@.insert_gateway_envelopes_keys(
                   p_originator_node_ids, p_originator_sequence_ids, p_topics,
                   p_originator_envelopes,
                   CASE WHEN p_payer_ids IS NOT NULL THEN
                       ARRAY(SELECT NULLIF(u.p, 0)
                               FROM pg_catalog.unnest(p_payer_ids) WITH ORDINALITY AS u(p, o)
                              ORDER BY u.o) END,
                   CASE WHEN p_gateway_times IS NOT NULL THEN
                       ARRAY(SELECT pg_catalog.timezone(INTERVAL '0', u.t)
                               FROM pg_catalog.unnest(p_gateway_times) WITH ORDINALITY AS u(t, o)
                              ORDER BY u.o) END,
                   p_expiries) AS k
    )
    SELECT n.originator_node_id, n.originator_sequence_id, i.payer, i.at
      FROM new n
     CROSS JOIN LATERAL (
           SELECT NULLIF(u.payer, 0) AS payer,
                  COALESCE(u.at, pg_catalog.timezone(INTERVAL '0', pg_catalog.now())) AS at
             FROM ROWS FROM (pg_catalog.unnest(p_originator_node_ids), pg_catalog.unnest(p_originator_sequence_ids), pg_catalog.unnest(p_payer_ids), pg_catalog.unnest(p_gateway_times))
                  WITH ORDINALITY AS u(node, seq, payer, at, ord)
            WHERE u.node = n.originator_node_id AND u.seq = n.originator_sequence_id
            ORDER BY u.ord
            LIMIT 1) AS i
     ORDER BY n.originator_node_id, n.originator_sequence_id
$$;
CREATE FUNCTION envelopes_xmtpd.prune_expired_below_ceilings(
    ceiling_node_ids integer[], ceiling_sequence_ids bigint[],
    as_of bigint DEFAULT NULL, lock_timeout_ms integer DEFAULT 200)
RETURNS TABLE (originator_node_id integer, band_start bigint, band_end bigint,
               deleted_rows bigint, dropped boolean)
LANGUAGE sql VOLATILE
AS $$
    SELECT * FROM @extschema@.prune_expired_below(ceiling_node_ids, ceiling_sequence_ids,
                                                  as_of, lock_timeout_ms)
$$;

-- ---------------------------------------------------------------------------
-- Dumps and restores (the docs' "Backup, restore and moving hosts").
-- ---------------------------------------------------------------------------

-- The indexes move from the roots to each originator's partition: pg_restore
-- attached the dumped partitions to roots whose indexes had already been cloned
-- into them, then created the same indexes again, so every restore failed.
-- Each originator's partition is detached (keeping its index clones, which take
-- the names a fresh install gives them), the roots' indexes are dropped, and
-- the partitions are attached again, which reads every band once.
DO $upgrade$
DECLARE
    parts text[][];
    part text[];
BEGIN
    SELECT COALESCE(pg_catalog.array_agg(ARRAY[i.inhparent::pg_catalog.regclass::text,
                                               i.inhrelid::pg_catalog.regclass::text,
                                               pg_catalog.pg_get_expr(c.relpartbound, c.oid)]),
                    '{}')
      INTO parts
      FROM pg_catalog.pg_inherits i
      JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid
     WHERE i.inhparent IN ('@extschema@.gateway_envelopes_meta'::pg_catalog.regclass,
                           '@extschema@.gateway_envelopes_blob'::pg_catalog.regclass);
    IF pg_catalog.cardinality(parts) > 0 THEN
        FOREACH part SLICE 1 IN ARRAY parts LOOP
            EXECUTE pg_catalog.format('ALTER TABLE %s DETACH PARTITION %s', part[1], part[2]);
        END LOOP;
    END IF;
    ALTER TABLE @extschema@.gateway_envelopes_meta DROP CONSTRAINT gateway_envelopes_meta_pkey;
    ALTER TABLE @extschema@.gateway_envelopes_blob DROP CONSTRAINT gateway_envelopes_blob_pkey;
    DROP INDEX @extschema@.gateway_envelopes_meta_topic_idx;
    DROP INDEX @extschema@.gateway_envelopes_meta_expiry_idx;
    IF pg_catalog.cardinality(parts) > 0 THEN
        FOREACH part SLICE 1 IN ARRAY parts LOOP
            EXECUTE pg_catalog.format('ALTER TABLE %s ATTACH PARTITION %s %s', part[1], part[2], part[3]);
        END LOOP;
    END IF;
END
$upgrade$;

-- A consumer's rows go with it by a trigger instead of foreign keys, which a
-- parallel pg_restore broke (dead_letters' is dropped above, with its new column).
ALTER TABLE @extschema@.consumer_envelope_cursors DROP CONSTRAINT consumer_envelope_cursors_consumer_fkey;
ALTER TABLE @extschema@.delivery_log DROP CONSTRAINT delivery_log_consumer_fkey;
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
CREATE TRIGGER consumer_deleted AFTER DELETE ON consumers
    FOR EACH ROW EXECUTE FUNCTION @extschema@._consumer_deleted();

-- The state a dump must carry: an extension's table is left out of dumps unless
-- registered here.
SELECT pg_catalog.pg_extension_config_dump('@extschema@.late_envelopes', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.late_envelopes_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.consumers', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.consumer_envelope_cursors', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.delivery_log', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.delivery_log_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.dead_letters', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.dead_letters_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.outbox', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.outbox_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.ingress_positions', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.maintenance_runs', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.maintenance_runs_run_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.pruned_maxima', '');

-- ---------------------------------------------------------------------------
-- The role bundles (sql/roles.sql) include the functions above: the reader
-- the new read shapes, envelope_of, originator_latest(), maintenance_status()
-- and the envelopes_xmtpd readers; the writer the packed and keyed inserts,
-- the ingress leases, the stream identity and the envelopes_xmtpd writers; the
-- consumer owners, leases, dead letters, lag and the standby flush positions.
-- ---------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION grant_reader(role name) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM @extschema@._check_role(role);
    EXECUTE format('GRANT USAGE ON SCHEMA @extschema@ TO %I', role);
    EXECUTE format('GRANT SELECT ON @extschema@.gateway_envelopes_view TO %I', role);
    EXECUTE format('GRANT EXECUTE ON FUNCTION
        @extschema@.envelope_of(integer, bigint),
        @extschema@.select_gateway_envelopes(integer[], bigint[], bytea[], integer[], integer),
        @extschema@.select_by_topic_cursors(bytea[], integer[], bigint[], integer, integer, boolean),
        @extschema@.select_wave(bytea[], integer[], bigint[], integer[], bigint[], integer, bigint, integer, boolean),
        @extschema@.select_newest_by_topic(bytea[]),
        @extschema@.select_originator(integer, bigint, integer, boolean),
        @extschema@.originator_maxima(integer[]),
        @extschema@.originator_ceilings(),
        @extschema@.originator_latest(),
        @extschema@.partitions(),
        @extschema@.maintenance_status(integer)
        TO %I', role);
    -- The xmtpd layer's readers (sql/xmtpd.sql).
    EXECUTE format('GRANT USAGE ON SCHEMA envelopes_xmtpd TO %I', role);
    EXECUTE format('GRANT EXECUTE ON FUNCTION
        envelopes_xmtpd._plain_cursor(integer[], bigint[]),
        envelopes_xmtpd._plain_entries(bytea[], integer[], bigint[]),
        envelopes_xmtpd._plain_topics(bytea[]),
        envelopes_xmtpd._limit(integer, boolean),
        envelopes_xmtpd._by_originators_by_entries(integer[], bigint[], integer),
        envelopes_xmtpd._by_topics_by_entries(integer[], bigint[], bytea[], integer),
        envelopes_xmtpd._unfiltered_by_entries(integer[], bigint[], integer),
        envelopes_xmtpd._per_topic_by_entries(bytea[], integer[], bigint[], integer, integer),
        envelopes_xmtpd._wave_by_entries(bytea[], integer[], bigint[], integer[], bigint[], integer, bigint, integer),
        envelopes_xmtpd.select_gateway_envelopes_by_single_originator(integer, bigint, integer),
        envelopes_xmtpd.select_gateway_envelopes_by_originators(integer[], bigint[], integer),
        envelopes_xmtpd.select_gateway_envelopes_by_topics(integer[], bigint[], bytea[], integer),
        envelopes_xmtpd.select_gateway_envelopes_unfiltered(integer[], bigint[], integer),
        envelopes_xmtpd.select_gateway_envelopes_by_per_topic_cursors(bytea[], integer[], bigint[], integer, integer),
        envelopes_xmtpd.select_gateway_envelopes_wave_scan(bytea[], integer[], bigint[], integer[], bigint[], integer, bigint, integer),
        envelopes_xmtpd.select_newest_from_topics(bytea[]),
        envelopes_xmtpd.select_originator_ceilings(integer[]),
        envelopes_xmtpd.select_vector_clock(),
        envelopes_xmtpd.get_latest_sequence_id(integer),
        envelopes_xmtpd.select_originator_node_ids()
        TO %I', role);
END $$;

CREATE OR REPLACE FUNCTION revoke_reader(role name) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM @extschema@._check_role(role);
    EXECUTE format('REVOKE SELECT ON @extschema@.gateway_envelopes_view FROM %I', role);
    EXECUTE format('REVOKE EXECUTE ON FUNCTION
        @extschema@.envelope_of(integer, bigint),
        @extschema@.select_gateway_envelopes(integer[], bigint[], bytea[], integer[], integer),
        @extschema@.select_by_topic_cursors(bytea[], integer[], bigint[], integer, integer, boolean),
        @extschema@.select_wave(bytea[], integer[], bigint[], integer[], bigint[], integer, bigint, integer, boolean),
        @extschema@.select_newest_by_topic(bytea[]),
        @extschema@.select_originator(integer, bigint, integer, boolean),
        @extschema@.originator_maxima(integer[]),
        @extschema@.originator_ceilings(),
        @extschema@.originator_latest(),
        @extschema@.partitions(),
        @extschema@.maintenance_status(integer)
        FROM %I', role);
    EXECUTE format('REVOKE EXECUTE ON FUNCTION
        envelopes_xmtpd._plain_cursor(integer[], bigint[]),
        envelopes_xmtpd._plain_entries(bytea[], integer[], bigint[]),
        envelopes_xmtpd._plain_topics(bytea[]),
        envelopes_xmtpd._by_originators_by_entries(integer[], bigint[], integer),
        envelopes_xmtpd._by_topics_by_entries(integer[], bigint[], bytea[], integer),
        envelopes_xmtpd._unfiltered_by_entries(integer[], bigint[], integer),
        envelopes_xmtpd._per_topic_by_entries(bytea[], integer[], bigint[], integer, integer),
        envelopes_xmtpd._wave_by_entries(bytea[], integer[], bigint[], integer[], bigint[], integer, bigint, integer),
        envelopes_xmtpd.select_gateway_envelopes_by_single_originator(integer, bigint, integer),
        envelopes_xmtpd.select_gateway_envelopes_by_originators(integer[], bigint[], integer),
        envelopes_xmtpd.select_gateway_envelopes_by_topics(integer[], bigint[], bytea[], integer),
        envelopes_xmtpd.select_gateway_envelopes_unfiltered(integer[], bigint[], integer),
        envelopes_xmtpd.select_gateway_envelopes_by_per_topic_cursors(bytea[], integer[], bigint[], integer, integer),
        envelopes_xmtpd.select_gateway_envelopes_wave_scan(bytea[], integer[], bigint[], integer[], bigint[], integer, bigint, integer),
        envelopes_xmtpd.select_newest_from_topics(bytea[]),
        envelopes_xmtpd.select_originator_ceilings(integer[]),
        envelopes_xmtpd.select_vector_clock(),
        envelopes_xmtpd.get_latest_sequence_id(integer),
        envelopes_xmtpd.select_originator_node_ids()
        FROM %I', role);
END $$;

CREATE OR REPLACE FUNCTION grant_writer(role name) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM @extschema@._check_role(role);
    EXECUTE format('GRANT USAGE ON SCHEMA @extschema@ TO %I', role);
    EXECUTE format('GRANT EXECUTE ON FUNCTION
        @extschema@.insert_gateway_envelope(integer, bigint, bytea, bytea, integer, timestamp with time zone, bigint),
        @extschema@.insert_gateway_envelopes(integer[], bigint[], bytea[], bytea[], integer[], timestamp with time zone[], bigint[]),
        @extschema@.insert_gateway_envelopes_keys(integer[], bigint[], bytea[], bytea[], integer[], timestamp with time zone[], bigint[]),
        @extschema@.insert_gateway_envelopes_packed(integer, text),
        @extschema@.insert_gateway_envelope_packed(integer, text),
        @extschema@.ensure_gateway_parts(integer, bigint, bigint),
        @extschema@.publish(text, bytea, jsonb),
        @extschema@.ingress_position(text, text),
        @extschema@.ingress_store_position(text, text, bigint),
        @extschema@.ingress_stream_position(text, text),
        @extschema@.ingress_store_position(text, text, bigint, text),
        @extschema@.ingress_lease(text, text),
        @extschema@.ingress_lease_release(text, text)
        TO %I', role);
    -- The xmtpd layer's writers (sql/xmtpd.sql).
    EXECUTE format('GRANT USAGE ON SCHEMA envelopes_xmtpd TO %I', role);
    EXECUTE format('GRANT EXECUTE ON FUNCTION
        envelopes_xmtpd._limit(integer, boolean),
        envelopes_xmtpd.ensure_gateway_parts_v3(integer, bigint, bigint),
        envelopes_xmtpd.insert_gateway_envelope_v3(integer, bigint, bytea, integer, timestamp without time zone, bigint, bytea),
        envelopes_xmtpd.insert_gateway_envelope_batch(integer[], bigint[], bytea[], integer[], timestamp without time zone[], bigint[], bytea[])
        TO %I', role);
END $$;

CREATE OR REPLACE FUNCTION revoke_writer(role name) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM @extschema@._check_role(role);
    EXECUTE format('REVOKE EXECUTE ON FUNCTION
        @extschema@.insert_gateway_envelope(integer, bigint, bytea, bytea, integer, timestamp with time zone, bigint),
        @extschema@.insert_gateway_envelopes(integer[], bigint[], bytea[], bytea[], integer[], timestamp with time zone[], bigint[]),
        @extschema@.insert_gateway_envelopes_keys(integer[], bigint[], bytea[], bytea[], integer[], timestamp with time zone[], bigint[]),
        @extschema@.insert_gateway_envelopes_packed(integer, text),
        @extschema@.insert_gateway_envelope_packed(integer, text),
        @extschema@.ensure_gateway_parts(integer, bigint, bigint),
        @extschema@.publish(text, bytea, jsonb),
        @extschema@.ingress_position(text, text),
        @extschema@.ingress_store_position(text, text, bigint),
        @extschema@.ingress_stream_position(text, text),
        @extschema@.ingress_store_position(text, text, bigint, text),
        @extschema@.ingress_lease(text, text),
        @extschema@.ingress_lease_release(text, text)
        FROM %I', role);
    EXECUTE format('REVOKE EXECUTE ON FUNCTION
        envelopes_xmtpd.ensure_gateway_parts_v3(integer, bigint, bigint),
        envelopes_xmtpd.insert_gateway_envelope_v3(integer, bigint, bytea, integer, timestamp without time zone, bigint, bytea),
        envelopes_xmtpd.insert_gateway_envelope_batch(integer[], bigint[], bytea[], integer[], timestamp without time zone[], bigint[], bytea[])
        FROM %I', role);
END $$;

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
        @extschema@.consumer_dead_letter(text, text, integer, bigint, bigint, text, text, integer, timestamp with time zone, timestamp with time zone),
        @extschema@.consumer_dead_letter_retries(text, integer),
        @extschema@.consumer_dead_letter_resolved(text, bigint[]),
        @extschema@.consumer_dead_letters(text),
        @extschema@.consumer_lease(text),
        @extschema@.consumer_lease_release(text),
        @extschema@.consumer_lag(text),
        @extschema@.consumer_envelopes_pending(text),
        @extschema@.consumer_set_owner(text, regrole),
        @extschema@.notification_queue_usage(),
        @extschema@.standby_flush_positions()
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
        @extschema@.consumer_dead_letter(text, text, integer, bigint, bigint, text, text, integer, timestamp with time zone, timestamp with time zone),
        @extschema@.consumer_dead_letter_retries(text, integer),
        @extschema@.consumer_dead_letter_resolved(text, bigint[]),
        @extschema@.consumer_dead_letters(text),
        @extschema@.consumer_lease(text),
        @extschema@.consumer_lease_release(text),
        @extschema@.consumer_lag(text),
        @extschema@.consumer_envelopes_pending(text),
        @extschema@.consumer_set_owner(text, regrole),
        @extschema@.notification_queue_usage(),
        @extschema@.standby_flush_positions()
        FROM %I', role);
END $$;

-- ---------------------------------------------------------------------------
-- Privileges, as a fresh install leaves them: nothing new is usable by PUBLIC,
-- and the roles granted a bundle before the upgrade get what it gained.
-- ---------------------------------------------------------------------------

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA @extschema@ FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA @extschema@ FROM PUBLIC;
REVOKE ALL ON SCHEMA envelopes_xmtpd FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA envelopes_xmtpd FROM PUBLIC;

-- A bundle's roles are found by a function it granted before 0.4.0. Readers
-- come before writers: both get envelopes_xmtpd's USAGE and _limit, whose
-- privilege entries then come in the order grant_reader and grant_writer give
-- them on a fresh install (tests/tests/upgrade.rs compares the two).
DO $upgrade$
DECLARE
    marker pg_catalog.regprocedure;
    gained text;
    grantee pg_catalog.regrole;
BEGIN
    FOR marker, gained IN VALUES
        -- Readers: the new read shapes.
        ('@extschema@.select_gateway_envelopes(integer[], bigint[], bytea[], integer[], integer)'::pg_catalog.regprocedure,
         'EXECUTE ON FUNCTION
            @extschema@.select_by_topic_cursors(bytea[], integer[], bigint[], integer, integer, boolean),
            @extschema@.select_wave(bytea[], integer[], bigint[], integer[], bigint[], integer, bigint, integer, boolean),
            @extschema@.select_newest_by_topic(bytea[]),
            @extschema@.select_originator(integer, bigint, integer, boolean),
            @extschema@.originator_maxima(integer[])'),
        -- Readers: what they see beside partitions(), and the envelopes_xmtpd readers.
        ('@extschema@.partitions()',
         'EXECUTE ON FUNCTION
            @extschema@.maintenance_status(integer),
            @extschema@.originator_latest()'),
        ('@extschema@.partitions()', 'USAGE ON SCHEMA envelopes_xmtpd'),
        ('@extschema@.partitions()',
         'EXECUTE ON FUNCTION
            envelopes_xmtpd._plain_cursor(integer[], bigint[]),
            envelopes_xmtpd._plain_entries(bytea[], integer[], bigint[]),
            envelopes_xmtpd._plain_topics(bytea[]),
            envelopes_xmtpd._limit(integer, boolean),
            envelopes_xmtpd._by_originators_by_entries(integer[], bigint[], integer),
            envelopes_xmtpd._by_topics_by_entries(integer[], bigint[], bytea[], integer),
            envelopes_xmtpd._unfiltered_by_entries(integer[], bigint[], integer),
            envelopes_xmtpd._per_topic_by_entries(bytea[], integer[], bigint[], integer, integer),
            envelopes_xmtpd._wave_by_entries(bytea[], integer[], bigint[], integer[], bigint[], integer, bigint, integer),
            envelopes_xmtpd.select_gateway_envelopes_by_single_originator(integer, bigint, integer),
            envelopes_xmtpd.select_gateway_envelopes_by_originators(integer[], bigint[], integer),
            envelopes_xmtpd.select_gateway_envelopes_by_topics(integer[], bigint[], bytea[], integer),
            envelopes_xmtpd.select_gateway_envelopes_unfiltered(integer[], bigint[], integer),
            envelopes_xmtpd.select_gateway_envelopes_by_per_topic_cursors(bytea[], integer[], bigint[], integer, integer),
            envelopes_xmtpd.select_gateway_envelopes_wave_scan(bytea[], integer[], bigint[], integer[], bigint[], integer, bigint, integer),
            envelopes_xmtpd.select_newest_from_topics(bytea[]),
            envelopes_xmtpd.select_originator_ceilings(integer[]),
            envelopes_xmtpd.select_vector_clock(),
            envelopes_xmtpd.get_latest_sequence_id(integer),
            envelopes_xmtpd.select_originator_node_ids()'),
        -- Writers: the packed and keyed inserts, the ingress lease, the
        -- envelopes_xmtpd writers.
        ('@extschema@.insert_gateway_envelopes(integer[], bigint[], bytea[], bytea[], integer[], timestamp with time zone[], bigint[])',
         'EXECUTE ON FUNCTION
            @extschema@.insert_gateway_envelopes_packed(integer, text),
            @extschema@.insert_gateway_envelope_packed(integer, text),
            @extschema@.insert_gateway_envelopes_keys(integer[], bigint[], bytea[], bytea[], integer[], timestamp with time zone[], bigint[]),
            @extschema@.ingress_lease(text, text),
            @extschema@.ingress_lease_release(text, text)'),
        ('@extschema@.insert_gateway_envelopes(integer[], bigint[], bytea[], bytea[], integer[], timestamp with time zone[], bigint[])',
         'USAGE ON SCHEMA envelopes_xmtpd'),
        ('@extschema@.insert_gateway_envelopes(integer[], bigint[], bytea[], bytea[], integer[], timestamp with time zone[], bigint[])',
         'EXECUTE ON FUNCTION
            envelopes_xmtpd._limit(integer, boolean),
            envelopes_xmtpd.ensure_gateway_parts_v3(integer, bigint, bigint),
            envelopes_xmtpd.insert_gateway_envelope_v3(integer, bigint, bytea, integer, timestamp without time zone, bigint, bytea),
            envelopes_xmtpd.insert_gateway_envelope_batch(integer[], bigint[], bytea[], integer[], timestamp without time zone[], bigint[], bytea[])'),
        -- Roles that store ingress positions: the stream identity.
        ('@extschema@.ingress_store_position(text, text, bigint)',
         'EXECUTE ON FUNCTION
            @extschema@.ingress_stream_position(text, text),
            @extschema@.ingress_store_position(text, text, bigint, text)'),
        -- Consumers.
        ('@extschema@.consumer_register(text, boolean)',
         'EXECUTE ON FUNCTION
            @extschema@.consumer_set_owner(text, regrole),
            @extschema@.consumer_dead_letter(text, text, integer, bigint, bigint, text, text, integer, timestamp with time zone, timestamp with time zone),
            @extschema@.consumer_dead_letter_retries(text, integer),
            @extschema@.consumer_dead_letters(text),
            @extschema@.consumer_lease(text),
            @extschema@.consumer_lease_release(text),
            @extschema@.consumer_lag(text),
            @extschema@.standby_flush_positions()')
    LOOP
        FOR grantee IN
            SELECT DISTINCT a.grantee::pg_catalog.regrole
              FROM pg_catalog.pg_proc p,
                   LATERAL pg_catalog.aclexplode(p.proacl) a
             WHERE p.oid = marker
               AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner AND a.grantee <> 0
        LOOP
            EXECUTE pg_catalog.format('GRANT %s TO %s', gained, grantee);
        END LOOP;
    END LOOP;
    -- envelope_of to every role that reads gateway_envelopes_view (SELECT on it,
    -- or on some of its columns), bundle or not: the view calls it as the reader.
    FOR grantee IN
        SELECT DISTINCT a.grantee::pg_catalog.regrole
          FROM pg_catalog.pg_class c,
               LATERAL pg_catalog.aclexplode(c.relacl) a
         WHERE c.oid = '@extschema@.gateway_envelopes_view'::pg_catalog.regclass
           AND a.privilege_type = 'SELECT' AND a.grantee <> c.relowner AND a.grantee <> 0
        UNION
        SELECT DISTINCT a.grantee::pg_catalog.regrole
          FROM pg_catalog.pg_attribute t,
               LATERAL pg_catalog.aclexplode(t.attacl) a
         WHERE t.attrelid = '@extschema@.gateway_envelopes_view'::pg_catalog.regclass
           AND a.privilege_type = 'SELECT' AND a.grantee <> 0
    LOOP
        EXECUTE pg_catalog.format(
            'GRANT EXECUTE ON FUNCTION @extschema@.envelope_of(integer, bigint) TO %s', grantee);
    END LOOP;
END
$upgrade$;
