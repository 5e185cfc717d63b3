-- pg_envelopes 0.3.0 -> 0.4.0: hardening. Pruning commits band by band in a
-- worker and never waits for a lock while holding one; consumers and ingress
-- positions belong to the role that made them; the limits are the owner's.
--
-- Released with 0.4.0; never edit it afterwards (scripts/test.sh checks
-- sql/releases/SHA256SUMS). Every statement brings a 0.3.0 database to exactly
-- what a fresh 0.4.0 install creates (tests/tests/upgrade.rs compares the two).
\echo Use "ALTER EXTENSION pg_envelopes UPDATE TO '0.4.0'" to load this file. \quit

-- Who may act for a consumer or an ingress position (src/consumer.rs).
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
ALTER TABLE consumers ADD COLUMN owner oid;
ALTER TABLE ingress_positions ADD COLUMN owner oid;

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
CREATE FUNCTION _check_consumer_owner(c @extschema@.consumers) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF c.owner IS NULL THEN
        UPDATE @extschema@.consumers k SET owner = COALESCE(k.owner, @extschema@._caller())
         WHERE k.name = c.name
        RETURNING k.owner INTO c.owner;
    END IF;
    IF NOT @extschema@._acts_for(c.owner) THEN
        RAISE EXCEPTION 'permission denied for consumer "%"', c.name
              USING ERRCODE = 'insufficient_privilege',
                    HINT = pg_catalog.format('It belongs to role %s: only that role (or a member of it) and the '
                                             'extension''s owner may read its batches and move its positions '
                                             '(envelopes.consumer_set_owner hands it over).',
                                             c.owner::pg_catalog.regrole);
    END IF;
END $$;
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
         WHERE c.name = d.consumer AND @extschema@._acts_for(COALESCE(c.owner, 0))
           AND ($1 IS NULL OR d.consumer = $1) AND ($2 IS NULL OR d.id = ANY ($2))
        RETURNING 1)
    SELECT count(*) FROM r
$$;
-- consumer_dead_letter_retries is no longer STABLE: it may claim an unowned consumer.
-- The dead letters of a consumer that were asked to be retried, with their rows
-- (NULL columns when the row no longer exists, e.g. pruned). The bridge asks on
-- every poll, so the common answer — nothing asked — costs one index probe; the
-- join with the envelope view is planned only when there is something to return.
CREATE OR REPLACE FUNCTION consumer_dead_letter_retries(consumer text, batch_size integer DEFAULT 100)
RETURNS TABLE (dead_letter_id bigint, kind text, originator_node_id integer, originator_sequence_id bigint,
               gateway_time timestamptz, topic bytea, payer_id integer, expiry bigint,
               originator_envelope bytea, outbox_id bigint, subject text, payload bytea, headers jsonb,
               created_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c @extschema@.consumers;
BEGIN
    IF batch_size IS NULL THEN
        RAISE EXCEPTION 'batch_size must not be NULL' USING ERRCODE = 'null_value_not_allowed';
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
    DELETE FROM @extschema@.dead_letters d
     WHERE d.consumer = consumer_dead_letter_resolved.consumer AND d.id = ANY (ids);
    GET DIAGNOSTICS n = ROW_COUNT;
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
    IF consumer IS NULL OR consumer = '' OR stream IS NULL OR new_position IS NULL THEN
        RAISE EXCEPTION 'consumer, stream and position must be given' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF new_position < 0 THEN
        RAISE EXCEPTION 'position must not be negative (got %)', new_position USING ERRCODE = 'numeric_value_out_of_range';
    END IF;
    INSERT INTO @extschema@.ingress_positions AS p (consumer, stream, position, owner)
    VALUES ($1, $2, $3, @extschema@._caller())
    ON CONFLICT ON CONSTRAINT ingress_positions_pkey
    DO UPDATE SET stream = EXCLUDED.stream,
                  position = GREATEST(p.position, EXCLUDED.position),
                  updated_at = now(),
                  owner = COALESCE(p.owner, EXCLUDED.owner)
          WHERE p.owner IS NULL OR @extschema@._acts_for(p.owner);
    GET DIAGNOSTICS moved = ROW_COUNT;
    IF moved = 0 THEN
        SELECT p.owner INTO owner FROM @extschema@.ingress_positions p WHERE p.consumer = $1;
        RAISE EXCEPTION 'permission denied for ingress consumer "%"', consumer
              USING ERRCODE = 'insufficient_privilege',
                    HINT = pg_catalog.format('Its position belongs to role %s: only that role (or a member of it) '
                                             'and the extension''s owner may move it.',
                                             owner::pg_catalog.regrole);
    END IF;
END $$;

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
        @extschema@.consumer_dead_letter(text, text, integer, bigint, bigint, text, text, integer, timestamp with time zone),
        @extschema@.consumer_dead_letter_retries(text, integer),
        @extschema@.consumer_dead_letter_resolved(text, bigint[]),
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
        @extschema@.consumer_dead_letter(text, text, integer, bigint, bigint, text, text, integer, timestamp with time zone),
        @extschema@.consumer_dead_letter_retries(text, integer),
        @extschema@.consumer_dead_letter_resolved(text, bigint[]),
        @extschema@.consumer_envelopes_pending(text),
        @extschema@.consumer_set_owner(text, regrole),
        @extschema@.notification_queue_usage()
        FROM %I', role);
END $$;

-- As in a fresh install: nothing new is usable by PUBLIC, and roles made with
-- grant_consumer before the upgrade get what grant_consumer gives now.
REVOKE ALL ON FUNCTION @extschema@._caller(), @extschema@._acts_for(oid),
    @extschema@._check_consumer_owner(@extschema@.consumers),
    @extschema@.consumer_set_owner(text, regrole),
    @extschema@.prune_expired(bigint, integer, boolean) FROM PUBLIC;
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
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION @extschema@.consumer_set_owner(text, regrole) TO %s',
                                  grantee);
    END LOOP;
END
$upgrade$;
