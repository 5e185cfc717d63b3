-- pg_envelopes 0.3.0 -> 0.4.0: hardening. Pruning commits band by band in a
-- worker and never waits for a lock while holding one; consumers and ingress
-- positions belong to the role that made them; the limits are the owner's.
--
-- Released with 0.4.0; never edit it afterwards (scripts/test.sh checks
-- sql/releases/SHA256SUMS). Every statement brings a 0.3.0 database to exactly
-- what a fresh 0.4.0 install creates (tests/tests/upgrade.rs compares the two).
\echo Use "ALTER EXTENSION pg_envelopes UPDATE TO '0.4.0'" to load this file. \quit

-- Who may act for a consumer or an ingress position (src/store/consumer/).
-- pg_envelopes::consumer::_caller
CREATE  FUNCTION "_caller"() RETURNS oid /* pg_sys :: Oid */
STRICT STABLE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_caller_wrapper';
-- pg_envelopes::consumer::_acts_for
CREATE  FUNCTION "_acts_for"(
	"owner" oid /* pg_sys :: Oid */
) RETURNS bool /* bool */
STRICT STABLE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_acts_for_wrapper';

-- Consumers and ingress positions made before 0.4.0 have no owner: the first role
-- that acts for one afterwards (the bridge that goes on using it) claims it.
ALTER TABLE consumers ADD COLUMN owner regrole;
ALTER TABLE ingress_positions ADD COLUMN owner regrole;

-- An ingress position is per (consumer, stream): keyed by the name alone, storing
-- a second stream's position under the same name kept the larger of the two and
-- skipped the other stream's messages. Each existing row keeps its stream.
ALTER TABLE ingress_positions DROP CONSTRAINT ingress_positions_pkey,
    ALTER COLUMN consumer SET NOT NULL,
    ADD CONSTRAINT ingress_positions_pkey PRIMARY KEY (consumer, stream);
COMMENT ON TABLE ingress_positions IS
    'Last bus stream sequence each ingress consumer stored per stream, committed with the envelopes.';

-- The late-envelope feed records a range per (transaction, originator, statement)
-- instead of a row per late envelope (src/store/feed/late.rs): the rows are the
-- meta rows flagged late with the entry's inserted_xid. Existing entries keep
-- covering their one row (both columns NULL). A consumer's late-feed position
-- becomes the entry id times 2^24 plus how far into the entry's range it has
-- read (2^24 - 1: the whole entry), so ids stop at 2^39 - 1.
ALTER TABLE late_envelopes ADD COLUMN last_sequence_id bigint, ADD COLUMN inserted_xid xid8;
ALTER TABLE late_envelopes ALTER COLUMN id SET MAXVALUE 549755813887;
UPDATE consumers SET late_id = late_id * 16777216 + 16777215 WHERE late_id > 0;

-- Refused rows are set aside at the first refusal and tried again by the bridge
-- on a short schedule, so one refused row no longer holds up the rest of the feed.
ALTER TABLE dead_letters ADD COLUMN next_attempt_at timestamptz;
CREATE INDEX dead_letters_next_attempt_idx ON dead_letters (consumer, next_attempt_at)
    WHERE next_attempt_at IS NOT NULL;
COMMENT ON TABLE dead_letters IS
    'Rows a consumer''s bus refused, set aside at once so the rest flows, tried again by the bridge on a short schedule (next_attempt_at) and then kept until retry_dead_letters().';

-- Locks a consumer's row for an update, or raises 42704 for an unknown one and
-- 42501 when the calling role may not act for it.
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
-- Raises 42501 when the calling role may not act for consumer c (see consumers);
-- a consumer without an owner becomes the caller's, unless another role claimed
-- it first.
-- The rule itself is Rust's (src/store/consumer/owner.rs), which the batch and
-- acknowledgement functions apply too.
-- pg_envelopes::api::roles::_consumer_owner_check
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
-- Asks consumers to try their dead letters again (all of them, one consumer's,
-- or the given ids; only of consumers the calling role may act for). The bridge
-- picks them up with consumer_dead_letter_retries().
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
-- consumer_dead_letter_retries returns the attempts too, and the rows whose
-- next automatic attempt is due (no longer STABLE: it may claim an unowned consumer).
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
    RETURN QUERY
    SELECT d.id, d.kind, d.originator_node_id, d.originator_sequence_id,
           v.gateway_time, v.topic, v.payer_id, v.expiry, v.originator_envelope,
           d.outbox_id, o.subject, o.payload, o.headers, o.created_at, d.attempts,
           d.retry_requested_at IS NOT NULL
      FROM @extschema@.dead_letters d
      LEFT JOIN @extschema@.gateway_envelopes_view v
             ON d.kind = 'envelope' AND v.originator_node_id = d.originator_node_id
            AND v.originator_sequence_id = d.originator_sequence_id
      LEFT JOIN @extschema@.outbox o ON d.kind = 'outbox' AND o.id = d.outbox_id
     WHERE d.consumer = consumer_dead_letter_retries.consumer
       AND (d.retry_requested_at IS NOT NULL OR d.next_attempt_at <= pg_catalog.now())
     ORDER BY d.id
     LIMIT batch_size;
END $$;
-- Removes dead letters a consumer delivered on retry (or whose rows are gone).
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
-- consumer_dead_letters: what `envelopes-bridge status` shows, for the consumer role.
CREATE FUNCTION consumer_dead_letters(consumer text DEFAULT NULL)
RETURNS SETOF @extschema@.dead_letters LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT d.* FROM @extschema@.dead_letters d
      JOIN @extschema@.consumers c ON c.name = d.consumer
     WHERE ($1 IS NULL OR d.consumer = $1) AND @extschema@._acts_for(COALESCE(c.owner::pg_catalog.oid, 0))
     ORDER BY d.id
$$;
-- How far a consumer is behind, cheaply enough to ask every round of a bridge
-- that is catching up: per originator, its ceiling minus the consumer's cursor,
-- plus the late-feed and outbox ids drawn after the consumer's positions. It
-- counts ids, not rows: a gap (a rolled-back insert) or a late arrival counted
-- in both its originator's range and the late feed make it a little larger than
-- consumer_status's exact counts, and a late-feed entry covering several rows
-- (a late batch) counts once; with dense ids and rows in order the two agree.
CREATE FUNCTION consumer_lag(consumer text) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c @extschema@.consumers;
    behind bigint;
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
    SELECT COALESCE(sum(GREATEST(g.max_sequence_id - COALESCE(k.sequence_id, 0), 0)), 0)::bigint
      INTO behind
      FROM @extschema@.originator_ceilings() g
      LEFT JOIN @extschema@.consumer_envelope_cursors k
             ON k.consumer = c.name AND k.originator_node_id = g.originator_node_id;
    RETURN behind
         + GREATEST(COALESCE(pg_catalog.pg_sequence_last_value('@extschema@.late_envelopes_id_seq'), 0) - (c.late_id >> 24), 0)
         + GREATEST(COALESCE(pg_catalog.pg_sequence_last_value('@extschema@.outbox_id_seq'), 0) - c.outbox_id, 0);
END $$;
-- Leases: one active bridge per consumer (src/store/lease.rs).
-- pg_envelopes::lease::_lease_take
CREATE  FUNCTION "_lease_take"(
	"kind" TEXT, /* Option < & str > */
	"name" TEXT, /* Option < & str > */
	"stream" TEXT DEFAULT '' /* Option < & str > */
) RETURNS INT /* Option < i32 > */
VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_lease_take_wrapper';
-- pg_envelopes::lease::_lease_release
CREATE  FUNCTION "_lease_release"(
	"kind" TEXT, /* Option < & str > */
	"name" TEXT, /* Option < & str > */
	"stream" TEXT DEFAULT '' /* Option < & str > */
) RETURNS bool /* bool */
VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_lease_release_wrapper';
-- pg_envelopes::lease::_lease_check
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
-- Acknowledgements are refused while another session holds the consumer's lease.
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
-- Per consumer: where it stands, what is committed but not yet acknowledged, how
-- old the oldest such row is, and its dead letters. envelopes_pending counts the
-- in-order envelopes up to each originator's ceiling and the late arrivals after
-- the consumer's late-feed position: what it can read next.
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
-- The stored position of a consumer on a stream (0 when it has none yet).
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
-- Moves a consumer's position forward (never backwards). Call it in the
-- transaction that inserts the envelopes read up to that position. Refused (42501)
-- for a consumer another role owns.
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
-- Sets a row aside for a consumer whose bus refuses it: called by the bridge
-- after its bounded retries, before it acknowledges past the row. Recording the
-- same row again adds the attempts and keeps the first attempt's time.
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
           last_attempt_at = now(), retry_requested_at = NULL, next_attempt_at = EXCLUDED.next_attempt_at
    RETURNING d.id INTO new_id;
    RETURN new_id;
END $$;

-- Every band of both tables, read from the catalog alone (no table is opened or
-- locked, so it never waits): originator, bounds (band_end NULL = MAXVALUE) and
-- the meta and blob leaves, NULL where one table lacks the band. prune_expired
-- lists its work with it; partitions() adds sizes.
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
-- Every band partition: its originator, bounds (band_end NULL = MAXVALUE), the meta
-- and blob tables, live rows (from the statistics system, so approximate and a
-- moment behind) and bytes on disk (both tables with their indexes and TOAST).
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

-- prune_expired is in Rust now, with a third argument.
DROP FUNCTION @extschema@.prune_expired(bigint, integer);
-- pg_envelopes::partition::prune::prune_expired
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
        @extschema@.consumer_dead_letter(text, text, integer, bigint, bigint, text, text, integer, timestamp with time zone, timestamp with time zone),
        @extschema@.consumer_dead_letter_retries(text, integer),
        @extschema@.consumer_dead_letter_resolved(text, bigint[]),
        @extschema@.consumer_dead_letters(text),
        @extschema@.consumer_lease(text),
        @extschema@.consumer_lease_release(text),
        @extschema@.consumer_lag(text),
        @extschema@.consumer_envelopes_pending(text),
        @extschema@.consumer_set_owner(text, regrole),
        @extschema@.notification_queue_usage()
        FROM %I', role);
END $$;

-- As in a fresh install: nothing new is usable by PUBLIC, and roles made with
-- grant_consumer before the upgrade get what grant_consumer gives now.
REVOKE ALL ON FUNCTION @extschema@._caller(), @extschema@._acts_for(oid), @extschema@._bands(),
    @extschema@._check_consumer_owner(@extschema@.consumers),
    @extschema@._consumer_owner_check(text, oid),
    @extschema@.consumer_set_owner(text, regrole),
    @extschema@.prune_expired(bigint, integer, boolean),
    @extschema@.consumer_dead_letter(text, text, integer, bigint, bigint, text, text, integer, timestamp with time zone, timestamp with time zone),
    @extschema@.consumer_dead_letter_retries(text, integer), @extschema@.consumer_dead_letters(text),
    @extschema@.consumer_lease(text), @extschema@.consumer_lease_release(text),
    @extschema@.consumer_lag(text), @extschema@.ingress_lease(text, text), @extschema@.ingress_lease_release(text, text),
    @extschema@._check_ingress_names(text, text),
    @extschema@._lease_take(text, text, text), @extschema@._lease_release(text, text, text),
    @extschema@._lease_check(text, text, text) FROM PUBLIC;
DO $upgrade$
DECLARE
    grantee text;
BEGIN
    FOR grantee IN
        SELECT DISTINCT a.grantee::pg_catalog.regrole::text
          FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
         WHERE p.oid = '@extschema@.consumer_register(text, boolean)'::pg_catalog.regprocedure
           AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner AND a.grantee <> 0
    LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION @extschema@.consumer_set_owner(text, regrole),
            @extschema@.consumer_dead_letter(text, text, integer, bigint, bigint, text, text, integer,
                                             timestamp with time zone, timestamp with time zone),
            @extschema@.consumer_dead_letter_retries(text, integer), @extschema@.consumer_dead_letters(text),
            @extschema@.consumer_lease(text), @extschema@.consumer_lease_release(text),
            @extschema@.consumer_lag(text) TO %s',
                                  grantee);
    END LOOP;
END
$upgrade$;

-- The insert functions no longer carry SET search_path, which Postgres applies on
-- every call: their hot path runs no SQL, and what does run SQL pins the path
-- itself (src/pg/definer.rs).
ALTER FUNCTION @extschema@.insert_gateway_envelope(integer, bigint, bytea, bytea, integer,
    timestamp with time zone, bigint) RESET search_path;
ALTER FUNCTION @extschema@.insert_gateway_envelopes(integer[], bigint[], bytea[], bytea[], integer[],
    timestamp with time zone[], bigint[]) RESET search_path;

-- The read shapes of an xmtpd node (src/store/read/shapes.rs), and the vector-clock
-- selector on the same direct index scans: no SQL runs in them, so they are no
-- longer SECURITY DEFINER with a pinned search_path (set up again on every
-- returned row); EXECUTE, granted by grant_reader, is the privilege they need.
ALTER FUNCTION select_gateway_envelopes(integer[], bigint[], bytea[], integer[], integer)
    SECURITY INVOKER RESET ALL;

-- pg_envelopes::shapes::originator_maxima
CREATE  FUNCTION "originator_maxima"(
	"originator_node_ids" INT[] /* :: std :: option :: Option < Array < '_, i32 > > */
) RETURNS TABLE (
	"originator_node_id" INT,  /* i32 */
	"max_sequence_id" bigint  /* i64 */
)
STABLE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'originator_maxima_wrapper';

-- pg_envelopes::shapes::select_by_topic_cursors
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

-- pg_envelopes::shapes::select_newest_by_topic
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

-- pg_envelopes::shapes::select_originator
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

-- pg_envelopes::shapes::select_wave
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

REVOKE ALL ON FUNCTION
    select_by_topic_cursors(bytea[], integer[], bigint[], integer, integer, boolean),
    select_wave(bytea[], integer[], bigint[], integer[], bigint[], integer, bigint, integer, boolean),
    select_newest_by_topic(bytea[]),
    select_originator(integer, bigint, integer, boolean),
    originator_maxima(integer[])
    FROM PUBLIC;

-- Roles granted the reader bundle before this upgrade get the new selectors too.
DO $$
DECLARE
    grantee pg_catalog.regrole;
BEGIN
    FOR grantee IN
        SELECT DISTINCT a.grantee::pg_catalog.regrole
          FROM pg_catalog.pg_proc p,
               LATERAL pg_catalog.aclexplode(p.proacl) a
         WHERE p.oid = '@extschema@.select_gateway_envelopes(integer[], bigint[], bytea[], integer[], integer)'::pg_catalog.regprocedure
           AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner AND a.grantee <> 0
    LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION
            @extschema@.select_by_topic_cursors(bytea[], integer[], bigint[], integer, integer, boolean),
            @extschema@.select_wave(bytea[], integer[], bigint[], integer[], bigint[], integer, bigint, integer, boolean),
            @extschema@.select_newest_by_topic(bytea[]),
            @extschema@.select_originator(integer, bigint, integer, boolean),
            @extschema@.originator_maxima(integer[])
            TO %s', grantee);
    END LOOP;
END $$;

CREATE OR REPLACE FUNCTION grant_reader(role name) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM @extschema@._check_role(role);
    EXECUTE format('GRANT USAGE ON SCHEMA @extschema@ TO %I', role);
    EXECUTE format('GRANT SELECT ON @extschema@.gateway_envelopes_view TO %I', role);
    EXECUTE format('GRANT EXECUTE ON FUNCTION
        @extschema@.select_gateway_envelopes(integer[], bigint[], bytea[], integer[], integer),
        @extschema@.select_by_topic_cursors(bytea[], integer[], bigint[], integer, integer, boolean),
        @extschema@.select_wave(bytea[], integer[], bigint[], integer[], bigint[], integer, bigint, integer, boolean),
        @extschema@.select_newest_by_topic(bytea[]),
        @extschema@.select_originator(integer, bigint, integer, boolean),
        @extschema@.originator_maxima(integer[]),
        @extschema@.originator_ceilings(),
        @extschema@.partitions()
        TO %I', role);
END $$;

CREATE OR REPLACE FUNCTION revoke_reader(role name) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM @extschema@._check_role(role);
    EXECUTE format('REVOKE SELECT ON @extschema@.gateway_envelopes_view FROM %I', role);
    EXECUTE format('REVOKE EXECUTE ON FUNCTION
        @extschema@.select_gateway_envelopes(integer[], bigint[], bytea[], integer[], integer),
        @extschema@.select_by_topic_cursors(bytea[], integer[], bigint[], integer, integer, boolean),
        @extschema@.select_wave(bytea[], integer[], bigint[], integer[], bigint[], integer, bigint, integer, boolean),
        @extschema@.select_newest_by_topic(bytea[]),
        @extschema@.select_originator(integer, bigint, integer, boolean),
        @extschema@.originator_maxima(integer[]),
        @extschema@.originator_ceilings(),
        @extschema@.partitions()
        FROM %I', role);
END $$;

-- The inserts in the packed form pg_envelopes_router sends a shard (one
-- originator's rows in one base64 value, src/store/write/mod.rs): a bytea[] in
-- PL/Proxy's text transfer costs the shard a parse of every character of the
-- array, and every argument of an unprepared call its share of planning.
CREATE FUNCTION insert_gateway_envelopes_packed(originator_node_id integer, packed_rows text)
RETURNS bigint VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'insert_gateway_envelopes_packed_wrapper';
REVOKE ALL ON FUNCTION insert_gateway_envelopes_packed(integer, text) FROM PUBLIC;
CREATE FUNCTION insert_gateway_envelope_packed(originator_node_id integer, packed_row text)
RETURNS bigint VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'insert_gateway_envelope_packed_wrapper';
REVOKE ALL ON FUNCTION insert_gateway_envelope_packed(integer, text) FROM PUBLIC;

-- Roles granted the writer bundle before this upgrade get it too.
DO $$
DECLARE
    grantee pg_catalog.regrole;
BEGIN
    FOR grantee IN
        SELECT DISTINCT a.grantee::pg_catalog.regrole
          FROM pg_catalog.pg_proc p,
               LATERAL pg_catalog.aclexplode(p.proacl) a
         WHERE p.oid = '@extschema@.insert_gateway_envelopes(integer[], bigint[], bytea[], bytea[], integer[], timestamp with time zone[], bigint[])'::pg_catalog.regprocedure
           AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner AND a.grantee <> 0
    LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION
            @extschema@.insert_gateway_envelopes_packed(integer, text),
            @extschema@.insert_gateway_envelope_packed(integer, text),
            @extschema@.ingress_lease(text, text),
            @extschema@.ingress_lease_release(text, text) TO %s', grantee);
    END LOOP;
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
        @extschema@.insert_gateway_envelopes_packed(integer, text),
        @extschema@.insert_gateway_envelope_packed(integer, text),
        @extschema@.ensure_gateway_parts(integer, bigint, bigint),
        @extschema@.publish(text, bytea, jsonb),
        @extschema@.ingress_position(text, text),
        @extschema@.ingress_store_position(text, text, bigint),
        @extschema@.ingress_lease(text, text),
        @extschema@.ingress_lease_release(text, text)
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
        @extschema@.insert_gateway_envelopes_packed(integer, text),
        @extschema@.insert_gateway_envelope_packed(integer, text),
        @extschema@.ensure_gateway_parts(integer, bigint, bigint),
        @extschema@.publish(text, bytea, jsonb),
        @extschema@.ingress_position(text, text),
        @extschema@.ingress_store_position(text, text, bigint),
        @extschema@.ingress_lease(text, text),
        @extschema@.ingress_lease_release(text, text)
        FROM %I', role);
END $$;

-- gateway_envelopes_view looks each meta row's bytes up by key instead of joining
-- blob (src/store/read/lookup.rs); same columns, same rows.
CREATE FUNCTION envelope_of(originator_node_id integer, originator_sequence_id bigint)
RETURNS bytea STRICT STABLE PARALLEL SAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'envelope_of_wrapper';
-- Revoked first, as a fresh install does, so the owner's entry comes first.
REVOKE ALL ON FUNCTION envelope_of(integer, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION envelope_of(integer, bigint) TO PUBLIC;

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
-- Issue 29: the direct paths under unusual but legal setups (appended here, in
-- a section of its own, while 0.4.0 is unreleased).
--
-- envelope_of, the view's per-row lookup, is no longer executable by PUBLIC: it
-- reads blob for whoever may call it, so the reader bundle grants it with the
-- view (src/store/read/lookup.rs). Roles that read the view before the upgrade (with SELECT
-- on it, or on some of its columns) keep reading it.
REVOKE EXECUTE ON FUNCTION envelope_of(integer, bigint) FROM PUBLIC;
DO $$
DECLARE
    grantee pg_catalog.regrole;
BEGIN
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
END $$;

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
        @extschema@.partitions()
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
        @extschema@.partitions()
        FROM %I', role);
END $$;


-- ---------------------------------------------------------------------------
-- Issue 31: the maintenance worker (appended here, in a section of its own,
-- while 0.4.0 is unreleased). Where pg_envelopes is in shared_preload_libraries,
-- a background worker prunes and creates bands ahead every
-- envelopes.maintenance_interval seconds in envelopes.maintenance_databases, and
-- records each run in this database (src/store/maintenance/). The same objects as
-- sql/maintenance.sql.

-- The maintenance worker's record (src/store/maintenance/): one row per run in
-- this database, inserted when the run starts (finished stays NULL while it
-- runs, and for a run whose worker was stopped) and completed when it ends. The
-- worker keeps the newest 1,000 runs. A run that failed somewhere names the
-- first failure in error (and counts the others); it still did what it could,
-- and the next interval tries again.
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

-- The newest runs, newest first, with how long each took (NULL while it runs).
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

-- Nothing is usable by PUBLIC until granted (sql/privileges.sql does this for a
-- fresh install).
REVOKE ALL ON FUNCTION maintenance_status(integer) FROM PUBLIC;
REVOKE ALL ON TABLE maintenance_runs FROM PUBLIC;

-- The reader bundle shows the maintenance runs, as it shows partitions(): roles
-- granted it before the upgrade (EXECUTE on partitions()) get them too.
DO $$
DECLARE
    grantee pg_catalog.regrole;
BEGIN
    FOR grantee IN
        SELECT DISTINCT a.grantee::pg_catalog.regrole
          FROM pg_catalog.pg_proc p,
               LATERAL pg_catalog.aclexplode(p.proacl) a
         WHERE p.oid = '@extschema@.partitions()'::pg_catalog.regprocedure
           AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner AND a.grantee <> 0
    LOOP
        EXECUTE pg_catalog.format(
            'GRANT EXECUTE ON FUNCTION @extschema@.maintenance_status(integer) TO %s', grantee);
    END LOOP;
END $$;

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
        @extschema@.partitions(),
        @extschema@.maintenance_status(integer)
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
        @extschema@.partitions(),
        @extschema@.maintenance_status(integer)
        FROM %I', role);
END $$;

-- Insert returning the new keys; pruning bounded per originator; the highest
-- sequence id ever stored per originator (src/api/insert.rs,
-- src/api/partitions.rs, src/api/reads.rs).
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
CREATE  FUNCTION "_stored_maxima"() RETURNS TABLE (
	"originator_node_id" INT,  /* i32 */
	"originator_sequence_id" bigint,  /* i64 */
	"gateway_time" timestamp with time zone  /* TimestampWithTimeZone */
)
STRICT STABLE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_stored_maxima_wrapper';

-- The highest key prune_expired has deleted per originator, with its gateway
-- time: originator_latest() reports the highest sequence id ever stored, which
-- pruning must not lower (xmtpd's vector clock, gateway_envelopes_latest, is
-- kept that way). Written by the pruning statement itself.
CREATE TABLE pruned_maxima (
    originator_node_id     integer     PRIMARY KEY,
    originator_sequence_id bigint      NOT NULL,
    gateway_time           timestamptz NOT NULL
);
COMMENT ON TABLE pruned_maxima IS
    'Per originator, the highest key pruning deleted (so originator_latest() survives pruning).';

-- Per originator, the highest sequence id ever stored (rows present, or deleted
-- by prune_expired) and that row's gateway time, ascending by originator. Rows
-- deleted by hand are not remembered.
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

-- envelopes_xmtpd: the store as xmtpd's queries see it. Each function is named
-- after the xmtpd query (or stored function) it stands in for, takes that
-- query's parameters and returns its columns, and answers as that query does
-- for every input xmtpd sends, where the functions in the extension's own
-- schema are stricter:
--
--   * a row_limit of 0 (or NULL) is no limit where the query writes
--     LIMIT NULLIF(row_limit, 0), and a negative one is an error (2201W);
--   * a node repeated in a cursor, an entry repeated in per-topic cursors, a
--     ceiling given twice: their rows come back as often as the query's joins
--     produce them; a NULL element matches nothing; arrays of different
--     lengths are read as far as the shortest (unnest ... WITH ORDINALITY
--     joined on the ordinal);
--   * gateway times are `timestamp` holding UTC, both ways, whatever the
--     session's TimeZone (converted with timezone(INTERVAL '0', ...): an
--     offset is arithmetic, where a zone name is looked up on every row);
--   * a payer id of 0 is no payer.
--
-- Every function is plain SQL over the extension's functions, runs as the
-- caller (grant_reader and grant_writer grant them), and schema-qualifies
-- everything it names. The readers are STABLE and neither STRICT nor SET
-- anything, so a call is inlined into the calling query. Where the input is
-- one the strict function takes as is (no repeats, no NULL, lengths equal) a
-- reader hands it straight over; otherwise it runs the query's shape entry by
-- entry. The two branches are UNION ALL with conditions on the arguments alone,
-- which the planner turns into one-time filters: only one branch runs, and it
-- returns its rows in the order of the query.

CREATE SCHEMA envelopes_xmtpd;
COMMENT ON SCHEMA envelopes_xmtpd IS
    'pg_envelopes as xmtpd''s queries see it: their names, parameters, columns and answers.';
REVOKE ALL ON SCHEMA envelopes_xmtpd FROM PUBLIC;

-- Whether a cursor is one the strict functions take as it is: both arrays
-- given, of one length, without NULL and without a repeated node. The checks
-- are PL/pgSQL, whose statements keep their plans: as SQL functions with a
-- subquery they were neither inlined nor cached, and planned on every call.
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

-- The same for per-topic cursor entries: three arrays of one length, no NULL,
-- no (topic, node) twice.
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

-- A topic list without NULL and without a topic twice.
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

-- A limit for the strict functions: NULL (LIMIT NULL) and, where zero_is_all,
-- 0 (LIMIT NULLIF(x, 0)) read everything; a negative one reads nothing (the
-- caller's own LIMIT raises 2201W for it first).
CREATE FUNCTION envelopes_xmtpd._limit(row_limit integer, zero_is_all boolean)
RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN row_limit IS NULL OR (row_limit = 0 AND zero_is_all) THEN 2147483647
                WHEN row_limit < 0 THEN 0
                ELSE row_limit END
$$;

-- SelectGatewayEnvelopesBySingleOriginator.
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

-- The readers below hand a plain input straight to the strict function and
-- any other to a helper that reads it entry by entry (_..._by_entries): the
-- helpers carry a SET clause, so they are not inlined, and their bodies are
-- planned only when they run, not with every call of the reader.

-- SelectGatewayEnvelopesByOriginators: only the cursor's originators, each
-- entry's rows after its position (at most row_limit of each), all ordered and
-- cut at row_limit.
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

-- SelectGatewayEnvelopesByTopics: every topic with every cursor entry; each
-- such pair's rows after the entry's position (at most row_limit), ordered and
-- cut at row_limit. Here a row_limit of 0 returns nothing, as that query's
-- LIMIT row_limit does.
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

-- SelectGatewayEnvelopesUnfiltered: every originator, those in the cursor
-- after their position (a NULL position counts as 0), the others after 0; a
-- node given n times brings each of its rows once per entry it is above.
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

-- SelectGatewayEnvelopesByPerTopicCursors: each (topic, node, position)
-- entry's first rows_per_entry rows after its position, ordered and cut at
-- row_limit (0: no limit); rows_per_entry 0 reads nothing of an entry.
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

-- SelectGatewayEnvelopesWaveScan: the entries' rows above their positions and
-- at most their originator's ceiling, strictly after (scan_node_id,
-- scan_sequence_id) compared as a row (a NULL scan_node_id matches nothing, a
-- NULL scan_sequence_id only later originators), ordered, at most row_limit
-- (0: none). An entry or a ceiling given twice brings its rows twice.
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

-- SelectNewestFromTopics: per topic given, its envelope with the latest
-- gateway time, ordered by topic.
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

-- SelectOriginatorCeilings: one row per element given, in the order given
-- (repeats included), 0 for an originator without rows.
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

-- SelectVectorClock: per originator, the highest sequence id ever stored and
-- its gateway time (what xmtpd keeps in gateway_envelopes_latest; pruning does
-- not lower it).
CREATE FUNCTION envelopes_xmtpd.select_vector_clock()
RETURNS TABLE (originator_node_id integer, originator_sequence_id bigint, gateway_time timestamp)
LANGUAGE sql STABLE
AS $$
    SELECT l.originator_node_id, l.originator_sequence_id, pg_catalog.timezone(INTERVAL '0', l.gateway_time)
      FROM @extschema@.originator_latest() AS l
     ORDER BY l.originator_node_id
$$;

-- GetLatestSequenceId: that clock's entry for one originator, 0 without one.
CREATE FUNCTION envelopes_xmtpd.get_latest_sequence_id(p_originator_node_id integer)
RETURNS bigint
LANGUAGE sql STABLE
AS $$
    SELECT COALESCE((SELECT l.originator_sequence_id FROM @extschema@.originator_latest() AS l
                      WHERE l.originator_node_id = p_originator_node_id), 0)
$$;

-- SelectOriginatorNodeIDs: the originators the clock has an entry for.
CREATE FUNCTION envelopes_xmtpd.select_originator_node_ids()
RETURNS SETOF integer
LANGUAGE sql STABLE
AS $$
    SELECT l.originator_node_id FROM @extschema@.originator_latest() AS l
     ORDER BY l.originator_node_id
$$;

-- ensure_gateway_parts_v3: the band width xmtpd passes is accepted from a
-- writer when it is the envelopes.band_width in force.
CREATE FUNCTION envelopes_xmtpd.ensure_gateway_parts_v3(
    p_originator_node_id integer, p_originator_sequence_id bigint, p_band_width bigint)
RETURNS void
LANGUAGE sql VOLATILE
AS $$
    SELECT @extschema@.ensure_gateway_parts(p_originator_node_id, p_originator_sequence_id,
                                            p_band_width)
$$;

-- InsertGatewayEnvelopeV3: one envelope; the counts of meta rows, blob rows
-- and both that it stored (0, 0, 0 for a key already stored).
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

-- The batch insert of insert_gateway_envelope_batch_v3 (its arguments up to
-- the envelopes; the usage and congestion it charges are xmtpd's own tables),
-- returning one row per envelope it stored: its key, payer (0 given is stored
-- as none) and gateway time, so that the calling statement charges usage for
-- exactly the rows that were new:
--   WITH new AS (SELECT * FROM envelopes_xmtpd.insert_gateway_envelope_batch(...))
--   INSERT INTO unsettled_usage ... SELECT ... FROM new ...
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

-- Pruning below xmtpd's settled payer reports: prune_expired_below with the
-- ceilings of GetPrunableCeiling (rows at or above an originator's ceiling, and
-- originators without one, are kept).
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

-- The roles' bundles include the functions above.
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

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA @extschema@ FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA @extschema@ FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA envelopes_xmtpd FROM PUBLIC;

-- Roles granted a bundle before this upgrade get what the bundle gained: the
-- reader bundle (EXECUTE on partitions()) originator_latest() and the xmtpd
-- layer's readers, the writer bundle (EXECUTE on insert_gateway_envelopes)
-- insert_gateway_envelopes_keys and the layer's writers.
DO $$
DECLARE
    grantee pg_catalog.regrole;
BEGIN
    FOR grantee IN
        SELECT DISTINCT a.grantee::pg_catalog.regrole
          FROM pg_catalog.pg_proc p,
               LATERAL pg_catalog.aclexplode(p.proacl) a
         WHERE p.oid = '@extschema@.partitions()'::pg_catalog.regprocedure
           AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner AND a.grantee <> 0
    LOOP
        EXECUTE pg_catalog.format(
            'GRANT EXECUTE ON FUNCTION @extschema@.originator_latest() TO %s', grantee);
        EXECUTE pg_catalog.format('GRANT USAGE ON SCHEMA envelopes_xmtpd TO %s', grantee);
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION
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
            TO %s', grantee);
    END LOOP;
    FOR grantee IN
        SELECT DISTINCT a.grantee::pg_catalog.regrole
          FROM pg_catalog.pg_proc p,
               LATERAL pg_catalog.aclexplode(p.proacl) a
         WHERE p.oid = '@extschema@.insert_gateway_envelopes(integer[], bigint[], bytea[], bytea[], integer[], timestamp with time zone[], bigint[])'::pg_catalog.regprocedure
           AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner AND a.grantee <> 0
    LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION
            @extschema@.insert_gateway_envelopes_keys(integer[], bigint[], bytea[], bytea[], integer[], timestamp with time zone[], bigint[])
            TO %s', grantee);
        EXECUTE pg_catalog.format('GRANT USAGE ON SCHEMA envelopes_xmtpd TO %s', grantee);
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION
        envelopes_xmtpd._limit(integer, boolean),
        envelopes_xmtpd.ensure_gateway_parts_v3(integer, bigint, bigint),
        envelopes_xmtpd.insert_gateway_envelope_v3(integer, bigint, bytea, integer, timestamp without time zone, bigint, bytea),
        envelopes_xmtpd.insert_gateway_envelope_batch(integer[], bigint[], bytea[], integer[], timestamp without time zone[], bigint[], bytea[])
            TO %s', grantee);
    END LOOP;
END $$;

-- Egress's --forward-after standby-flush reads every standby's flush
-- position through standby_flush_positions() (pg_stat_replication hides other
-- users' LSNs from a consumer role); grant_consumer grants it, and roles made
-- with grant_consumer before the upgrade get it too.

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
REVOKE ALL ON FUNCTION @extschema@.standby_flush_positions() FROM PUBLIC;
DO $upgrade$
DECLARE
    grantee text;
BEGIN
    FOR grantee IN
        SELECT DISTINCT a.grantee::pg_catalog.regrole::text
          FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
         WHERE p.oid = '@extschema@.consumer_register(text, boolean)'::pg_catalog.regprocedure
           AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner AND a.grantee <> 0
    LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION @extschema@.standby_flush_positions() TO %s',
                                  grantee);
    END LOOP;
END
$upgrade$;

-- Dumps and restores (the docs' "Backup, restore and moving hosts").
--
-- The indexes move from the roots to each originator's partition: pg_restore
-- creates the roots with CREATE EXTENSION and then attaches the dumped
-- partitions, and a root's index was cloned into each of them just before the
-- dump created the same index again, so every restore failed. Each originator's
-- partition is detached (its indexes, clones of the roots', stay with it and
-- become its own, with the names a fresh install gives them), the roots' indexes
-- are dropped, and the partitions are attached again. Attaching reads every band
-- once to check that its rows belong to its originator.
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

-- A consumer's rows go with it by a trigger, not by foreign keys, which a
-- parallel pg_restore of the extension's tables broke (sql/consumer.sql).
ALTER TABLE @extschema@.consumer_envelope_cursors DROP CONSTRAINT consumer_envelope_cursors_consumer_fkey;
ALTER TABLE @extschema@.delivery_log DROP CONSTRAINT delivery_log_consumer_fkey;
ALTER TABLE @extschema@.dead_letters DROP CONSTRAINT dead_letters_consumer_fkey;
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
REVOKE ALL ON FUNCTION @extschema@._consumer_deleted() FROM PUBLIC;

-- The state a dump must carry: a table an extension creates is left out of
-- every dump unless it is registered here (undelivered outbox rows, consumers
-- and their positions, the late-envelope feed, dead letters, ingress positions).
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

-- An ingress position says which incarnation of its stream it counts in (a stream
-- deleted and re-created under the same name numbers from 1 again; the old position
-- skipped the new stream's first messages): a column for the stream's identity, a
-- reader and a writer of it, granted to the roles that store ingress positions.
ALTER TABLE ingress_positions ADD COLUMN stream_identity text;
-- The stored position of a consumer on a stream and the identity of the stream it
-- counts in: (0, NULL) when there is none yet; identity NULL when none was stored.
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

-- Stores a consumer's position on a stream together with the identity of the
-- stream it was read from. On the same identity the position only moves forward;
-- on another one (the stream was re-created, and numbers from 1 again) it is
-- replaced, backwards if need be. Otherwise as ingress_store_position(consumer,
-- stream, new_position): 42501 for a position another role owns, 55006 while
-- another session holds the ingress lease; a NULL identity is refused (22004),
-- an empty one too (22023).
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

REVOKE ALL ON FUNCTION @extschema@.ingress_stream_position(text, text),
    @extschema@.ingress_store_position(text, text, bigint, text) FROM PUBLIC;
DO $upgrade$
DECLARE
    grantee text;
BEGIN
    FOR grantee IN
        SELECT DISTINCT a.grantee::pg_catalog.regrole::text
          FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
         WHERE p.oid = '@extschema@.ingress_store_position(text, text, bigint)'::pg_catalog.regprocedure
           AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner AND a.grantee <> 0
    LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION
            @extschema@.ingress_stream_position(text, text),
            @extschema@.ingress_store_position(text, text, bigint, text) TO %s', grantee);
    END LOOP;
END
$upgrade$;

-- orphaned_envelopes() reads band by band in Rust: the SQL anti-join over the
-- roots locked every band of both tables at once and ran out of the lock table
-- (53200) at a few thousand bands.
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
REVOKE ALL ON FUNCTION @extschema@.orphaned_envelopes() FROM PUBLIC;

-- store_size(): the store's originators and bands against the lock table.
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
REVOKE ALL ON FUNCTION @extschema@.store_size() FROM PUBLIC;

-- consumer_lag counts rows, not ids (issue 43): the ids between a cursor and a
-- ceiling counted rows that never existed (a gap, a rolled-back insert) and a
-- late batch once. The same grants stay.
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
CREATE OR REPLACE FUNCTION consumer_lag(consumer text) RETURNS bigint
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

-- retry_dead_letters() is never lost to a refusal the bridge records while it is
-- at the row (issue 43): the hand-out consumes the request, the refusal keeps
-- whatever request came after it. Same signatures, grants kept.
-- Sets a row aside for a consumer whose bus refuses it: called by the bridge at
-- the refusal, before it acknowledges past the row. next_attempt_at is when the
-- bridge means to try it again by itself (NULL: not any more, it waits for
-- retry_dead_letters()). Recording the same row again adds the attempts, keeps
-- the first attempt's time and clears an operator's retry request. Returns the
-- dead letter's id.
CREATE OR REPLACE FUNCTION consumer_dead_letter(consumer text, kind text, originator_node_id integer,
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

-- The dead letters of a consumer that are due again: asked for by
-- retry_dead_letters(), or whose next_attempt_at has come. With their rows (NULL
-- columns when the row no longer exists, e.g. pruned), the attempts so far and
-- whether an operator asked (the bridge then reconnects to its bus first, to
-- learn its limits anew).
-- The bridge asks on every poll, so the common answer — nothing due — costs two
-- index probes; the join with the envelope view is planned only when there is
-- something to return.
CREATE OR REPLACE FUNCTION consumer_dead_letter_retries(consumer text, batch_size integer DEFAULT 100)
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
