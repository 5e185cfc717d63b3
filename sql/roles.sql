-- Least privilege. Nothing in the schema is usable by PUBLIC; an administrator
-- (the extension owner) grants one of three bundles to application roles:
--
--   writer    inserts envelopes (creating partitions for new originators and
--             bands), publishes outbox messages, stores ingress positions
--   reader    reads envelopes: the selectors, the view, ceilings, partitions,
--             the maintenance worker's runs
--   consumer  a reader that also keeps a consumer cursor (the egress bridge)
--
-- A consumer belongs to the role that registered it, an ingress position to the
-- role that stored it first: other roles granted the same bundle get 42501 on
-- them (members of the owning role and the extension owner excepted), so one
-- bridge cannot move another's cursor. consumer_set_owner hands one over.
--
-- The functions that write, or that run SQL on the partitions, are SECURITY
-- DEFINER with search_path pinned to pg_catalog, pg_temp, and name every object
-- schema-qualified: the roles need no privilege on the tables, own nothing, and
-- have no CREATE anywhere, so they cannot drop or alter a partition. The
-- selectors run no SQL (they scan the band leaves' indexes directly, which
-- checks no table privilege), so EXECUTE granted here is what lets a role use
-- them; those with a commit-safe form are SECURITY DEFINER without a SET clause
-- (that form samples the feed's sequences), the others run as the caller.

CREATE FUNCTION grant_writer(role name) RETURNS void
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

CREATE FUNCTION revoke_writer(role name) RETURNS void
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

CREATE FUNCTION grant_reader(role name) RETURNS void
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

CREATE FUNCTION revoke_reader(role name) RETURNS void
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

CREATE FUNCTION grant_consumer(role name) RETURNS void
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

CREATE FUNCTION revoke_consumer(role name) RETURNS void
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

-- Errors out clearly for a role that does not exist (42704) or is NULL (22004).
CREATE FUNCTION _check_role(role name) RETURNS void
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
