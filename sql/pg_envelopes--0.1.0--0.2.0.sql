-- pg_envelopes 0.1.0 -> 0.2.0: least privilege.
--
-- Released with 0.2.0; never edit it afterwards (scripts/test.sh checks
-- sql/releases/SHA256SUMS). Every statement brings a 0.1.0 database to exactly
-- what a fresh 0.2.0 install creates (tests/tests/upgrade.rs compares the two).
\echo Use "ALTER EXTENSION pg_envelopes UPDATE TO '0.2.0'" to load this file. \quit

-- Functions that write, or that read partitions directly, run with the extension
-- owner's rights so application roles need no table privileges; their
-- search_path is pinned so nothing a caller puts first can be called instead.
ALTER FUNCTION @extschema@.insert_gateway_envelope(integer, bigint, bytea, bytea, integer, timestamp with time zone, bigint)
    SECURITY DEFINER SET search_path TO pg_catalog, pg_temp;
ALTER FUNCTION @extschema@.insert_gateway_envelopes(integer[], bigint[], bytea[], bytea[], integer[], timestamp with time zone[], bigint[])
    SECURITY DEFINER SET search_path TO pg_catalog, pg_temp;
ALTER FUNCTION @extschema@.ensure_gateway_parts(integer, bigint, bigint)
    SECURITY DEFINER SET search_path TO pg_catalog, pg_temp;
ALTER FUNCTION @extschema@.publish(text, bytea, jsonb)
    SECURITY DEFINER SET search_path TO pg_catalog, pg_temp;
ALTER FUNCTION @extschema@.select_gateway_envelopes(integer[], bigint[], bytea[], integer[], integer)
    SECURITY DEFINER SET search_path TO pg_catalog, pg_temp;
ALTER FUNCTION @extschema@.originator_ceilings()
    SECURITY DEFINER SET search_path TO pg_catalog, pg_temp;
ALTER FUNCTION @extschema@.consumer_envelope_batch(text, integer)
    SECURITY DEFINER SET search_path TO pg_catalog, pg_temp;
ALTER FUNCTION @extschema@.orphaned_envelopes()
    SECURITY DEFINER SET search_path TO pg_catalog, pg_temp;
ALTER FUNCTION @extschema@.partitions()
    SECURITY DEFINER SET search_path TO pg_catalog, pg_temp;
ALTER FUNCTION @extschema@.consumer_register(text, boolean) SECURITY DEFINER;
ALTER FUNCTION @extschema@.consumer_outbox_batch(text, integer) SECURITY DEFINER;
ALTER FUNCTION @extschema@.consumer_outbox_ack(text, xid8, bigint) SECURITY DEFINER;
ALTER FUNCTION @extschema@.consumer_envelope_ack(text, integer[], bigint[]) SECURITY DEFINER;
ALTER FUNCTION @extschema@.ingress_position(text, text) SECURITY DEFINER;
ALTER FUNCTION @extschema@.ingress_store_position(text, text, bigint) SECURITY DEFINER;

-- prune_expired leaves alone a band a session has just created or found and not
-- yet filled (see envelopes._prune_guard).
CREATE FUNCTION @extschema@._prune_guard("originator_node_id" INT, "band_start" bigint) RETURNS bool
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', '_prune_guard_wrapper';

CREATE OR REPLACE FUNCTION @extschema@.prune_expired(as_of bigint DEFAULT NULL, lock_timeout_ms integer DEFAULT 200)
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


-- The grant_/revoke_ functions, as in sql/roles.sql of 0.2.0.
CREATE FUNCTION @extschema@.grant_writer(role name) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM @extschema@._check_role(role);
    EXECUTE format('GRANT USAGE ON SCHEMA @extschema@ TO %I', role);
    EXECUTE format('GRANT EXECUTE ON FUNCTION
        @extschema@.insert_gateway_envelope(integer, bigint, bytea, bytea, integer, timestamp with time zone, bigint),
        @extschema@.insert_gateway_envelopes(integer[], bigint[], bytea[], bytea[], integer[], timestamp with time zone[], bigint[]),
        @extschema@.ensure_gateway_parts(integer, bigint, bigint),
        @extschema@.publish(text, bytea, jsonb),
        @extschema@.ingress_position(text, text),
        @extschema@.ingress_store_position(text, text, bigint)
        TO %I', role);
END $$;

CREATE FUNCTION @extschema@.revoke_writer(role name) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM @extschema@._check_role(role);
    EXECUTE format('REVOKE EXECUTE ON FUNCTION
        @extschema@.insert_gateway_envelope(integer, bigint, bytea, bytea, integer, timestamp with time zone, bigint),
        @extschema@.insert_gateway_envelopes(integer[], bigint[], bytea[], bytea[], integer[], timestamp with time zone[], bigint[]),
        @extschema@.ensure_gateway_parts(integer, bigint, bigint),
        @extschema@.publish(text, bytea, jsonb),
        @extschema@.ingress_position(text, text),
        @extschema@.ingress_store_position(text, text, bigint)
        FROM %I', role);
END $$;

CREATE FUNCTION @extschema@.grant_reader(role name) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM @extschema@._check_role(role);
    EXECUTE format('GRANT USAGE ON SCHEMA @extschema@ TO %I', role);
    EXECUTE format('GRANT SELECT ON @extschema@.gateway_envelopes_view TO %I', role);
    EXECUTE format('GRANT EXECUTE ON FUNCTION
        @extschema@.select_gateway_envelopes(integer[], bigint[], bytea[], integer[], integer),
        @extschema@.originator_ceilings(),
        @extschema@.partitions()
        TO %I', role);
END $$;

CREATE FUNCTION @extschema@.revoke_reader(role name) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM @extschema@._check_role(role);
    EXECUTE format('REVOKE SELECT ON @extschema@.gateway_envelopes_view FROM %I', role);
    EXECUTE format('REVOKE EXECUTE ON FUNCTION
        @extschema@.select_gateway_envelopes(integer[], bigint[], bytea[], integer[], integer),
        @extschema@.originator_ceilings(),
        @extschema@.partitions()
        FROM %I', role);
END $$;

CREATE FUNCTION @extschema@.grant_consumer(role name) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM @extschema@.grant_reader(role);
    EXECUTE format('GRANT SELECT ON @extschema@.consumer_status TO %I', role);
    EXECUTE format('GRANT EXECUTE ON FUNCTION
        @extschema@.consumer_register(text, boolean),
        @extschema@.consumer_outbox_batch(text, integer),
        @extschema@.consumer_outbox_ack(text, xid8, bigint),
        @extschema@.consumer_envelope_batch(text, integer),
        @extschema@.consumer_envelope_ack(text, integer[], bigint[]),
        @extschema@.notification_queue_usage()
        TO %I', role);
END $$;

CREATE FUNCTION @extschema@.revoke_consumer(role name) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM @extschema@.revoke_reader(role);
    EXECUTE format('REVOKE SELECT ON @extschema@.consumer_status FROM %I', role);
    EXECUTE format('REVOKE EXECUTE ON FUNCTION
        @extschema@.consumer_register(text, boolean),
        @extschema@.consumer_outbox_batch(text, integer),
        @extschema@.consumer_outbox_ack(text, xid8, bigint),
        @extschema@.consumer_envelope_batch(text, integer),
        @extschema@.consumer_envelope_ack(text, integer[], bigint[]),
        @extschema@.notification_queue_usage()
        FROM %I', role);
END $$;

-- Errors out clearly for a role that does not exist (42704) or is NULL (22004).
CREATE FUNCTION @extschema@._check_role(role name) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF role IS NULL THEN
        RAISE EXCEPTION 'role must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.rolname = role) THEN
        RAISE EXCEPTION 'role "%" does not exist', role USING ERRCODE = 'undefined_object';
    END IF;
END $$;

-- Nothing is usable by PUBLIC until granted, as in sql/privileges.sql of 0.2.0.
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA @extschema@ FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA @extschema@ FROM PUBLIC;
REVOKE ALL ON SCHEMA @extschema@ FROM PUBLIC;
