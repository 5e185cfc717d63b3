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
