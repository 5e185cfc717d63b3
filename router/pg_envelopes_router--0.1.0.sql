-- pg_envelopes_router 0.1.0: the pg_envelopes writer's and reader's functions in a
-- proxy database, each routed by PL/Proxy to the shard that owns its originator.
--
-- An originator belongs to partition hashint4(originator_node_id) & (N - 1), N a
-- power of two; envelopes_router.partition_map names the shard (a libpq
-- connection string) of each partition, and the foreign server
-- envelopes_router_shards mirrors it as PL/Proxy's cluster definition (options p0
-- .. pN-1). Several partitions share a shard, so a shard is split later by
-- moving partitions, not by rehashing.
\echo Use "CREATE EXTENSION pg_envelopes_router CASCADE" to load this file. \quit

CREATE SCHEMA envelopes_router;

CREATE TABLE envelopes_router.partition_map (
    partition integer PRIMARY KEY CHECK (partition >= 0),
    shard text NOT NULL CHECK (shard <> ''),
    -- Set by move_partition from the switch until the move is verified: the
    -- shard that may still hold rows the new one has not got yet.
    previous_shard text
);
COMMENT ON TABLE envelopes_router.partition_map IS
    'The shard (libpq connection string) of each hash partition; change it with set_shards or move_partition';
SELECT pg_catalog.pg_extension_config_dump('envelopes_router.partition_map', '');

-- The cluster exists from the start with one placeholder partition (PL/Proxy
-- wants a power of two): a socket directory that does not exist, so a call before
-- set_shards fails at once with a connection error that names
-- pg_envelopes_router_has_no_shards, and reaches no server. The routed functions
-- name the cluster as a constant: a function there (it used to be one, checking
-- partition_map for a clearer error) runs on every call, 9 us in PL/pgSQL.
CREATE SERVER envelopes_router_shards FOREIGN DATA WRAPPER plproxy
    OPTIONS (p0 'host=/nonexistent/pg_envelopes_router_has_no_shards dbname=none connect_timeout=1');
CREATE USER MAPPING FOR PUBLIC SERVER envelopes_router_shards;

-- Rewrites the server's partition options from partition_map, in one ALTER
-- SERVER (PL/Proxy's validator refuses a cluster whose partition count is not a
-- power of two at every step).
CREATE FUNCTION envelopes_router._sync_server() RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    actions text[];
BEGIN
    WITH existing AS (
        SELECT split_part(o, '=', 1) AS key
          FROM pg_catalog.pg_foreign_server s, unnest(s.srvoptions) o
         WHERE s.srvname = 'envelopes_router_shards' AND split_part(o, '=', 1) ~ '^p[0-9]+$'
    ), wanted AS (
        SELECT 'p' || m.partition AS key, m.shard FROM envelopes_router.partition_map m
    )
    SELECT array_agg(CASE WHEN w.key IS NULL THEN format('DROP %I', e.key)
                          WHEN e.key IS NULL THEN format('ADD %I %L', w.key, w.shard)
                          ELSE format('SET %I %L', w.key, w.shard) END)
      INTO actions
      FROM existing e FULL JOIN wanted w USING (key);
    EXECUTE format('ALTER SERVER envelopes_router_shards OPTIONS (%s)',
                   array_to_string(actions, ', '));
END;
$$;

-- Sets the shards: partition p goes to shards[p % cardinality(shards) + 1].
-- Refused once a map exists unless it is the same map or replace => true (a
-- different map sends originators to shards that do not hold their rows; move
-- partitions one by one with move_partition instead).
CREATE FUNCTION envelopes_router.set_shards(shards text[], partitions integer DEFAULT 16,
                                            replace boolean DEFAULT false)
RETURNS SETOF envelopes_router.partition_map
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n integer := cardinality(shards);
BEGIN
    IF shards IS NULL OR n = 0 THEN
        RAISE EXCEPTION 'shards must name at least one shard' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF array_position(shards, NULL) IS NOT NULL OR '' = ANY (shards) THEN
        RAISE EXCEPTION 'shards must not contain NULL or empty connection strings'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF partitions IS NULL OR partitions < 1 OR partitions > 1024
       OR (partitions & (partitions - 1)) <> 0 THEN
        RAISE EXCEPTION 'partitions must be a power of two between 1 and 1024, not %', partitions
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF partitions < n THEN
        RAISE EXCEPTION '% partitions cannot cover % shards', partitions, n
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Give at least as many partitions as shards.';
    END IF;
    IF EXISTS (SELECT 1 FROM envelopes_router.partition_map) AND NOT coalesce(replace, false) THEN
        IF (SELECT array_agg(shard ORDER BY partition) FROM envelopes_router.partition_map)
           IS DISTINCT FROM
           (SELECT array_agg(shards[p % n + 1] ORDER BY p) FROM generate_series(0, partitions - 1) p) THEN
            RAISE EXCEPTION 'the router already has a different partition map'
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      HINT = 'Move partitions with envelopes_router.move_partition, or pass replace => true for a store with no rows yet.';
        END IF;
    END IF;
    LOCK TABLE envelopes_router.partition_map IN EXCLUSIVE MODE;
    DELETE FROM envelopes_router.partition_map;
    INSERT INTO envelopes_router.partition_map (partition, shard)
    SELECT p, shards[p % n + 1] FROM generate_series(0, partitions - 1) p;
    PERFORM envelopes_router._sync_server();
    RETURN QUERY SELECT * FROM envelopes_router.partition_map ORDER BY partition;
END;
$$;

-- The partition of an originator under the current map.
CREATE FUNCTION envelopes_router.partition_of(originator_node_id integer) RETURNS integer
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
AS $$
    SELECT hashint4(originator_node_id) & ((SELECT count(*) FROM envelopes_router.partition_map)::integer - 1)
$$;

-- The shard that holds an originator.
CREATE FUNCTION envelopes_router.shard_of(originator_node_id integer) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
AS $$
    SELECT shard FROM envelopes_router.partition_map
     WHERE partition = envelopes_router.partition_of(originator_node_id)
$$;

-- Each shard and the partitions it holds.
CREATE FUNCTION envelopes_router.shards()
RETURNS TABLE (shard text, partitions integer[])
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
AS $$
    SELECT m.shard, array_agg(m.partition ORDER BY m.partition)
      FROM envelopes_router.partition_map m
     GROUP BY m.shard
     ORDER BY min(m.partition)
$$;

-- Partition numbers (as hashes PL/Proxy maps to themselves) of the shards that
-- hold the given originators: every partition when the list is NULL, partition 0
-- when it names no originator (that shard checks the arguments and answers with
-- no rows, as one node would).
CREATE FUNCTION envelopes_router._hashes(originator_node_ids integer[]) RETURNS SETOF integer
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
AS $$
    SELECT p.partition FROM envelopes_router.partition_map p WHERE originator_node_ids IS NULL
    UNION
    SELECT hashint4(o) FROM unnest(originator_node_ids) o WHERE o IS NOT NULL
    UNION
    SELECT 0 WHERE originator_node_ids IS NOT NULL
               AND NOT EXISTS (SELECT 1 FROM unnest(originator_node_ids) o WHERE o IS NOT NULL)
$$;

-- ---------------------------------------------------------------------------
-- The writer's functions.
-- ---------------------------------------------------------------------------

-- A single row packed into one base64 value (see the shard's
-- insert_gateway_envelope_packed): PL/Proxy sends every call unprepared, and a
-- call of two arguments costs the shard less to parse and plan than one of seven
-- (bench/router_instructions.sh). Called in the target list: PL/Proxy's own form
-- (the function in FROM, every argument cast) costs more still.
CREATE FUNCTION envelopes_router._insert_gateway_envelope_packed(
    originator_node_id integer, packed_row text)
RETURNS bigint LANGUAGE plproxy
AS $$
    CLUSTER 'envelopes_router_shards';
    RUN ON pg_catalog.hashint4(originator_node_id);
    SELECT envelopes.insert_gateway_envelope_packed(originator_node_id, packed_row);
$$;

-- One row in the packed form the shards' insert_gateway_envelope(s)_packed read:
-- sequence id, topic and envelope with their lengths, a flags byte (1 payer,
-- 2 gateway time, 4 expiry), then the optional values given, all binary. A plain
-- SQL expression, so the planner inlines it where it is called; every name is
-- qualified, as callers run with their own search_path.
CREATE FUNCTION envelopes_router._packed_row(
    seq bigint, topic bytea, envelope bytea, payer integer, gtime timestamptz, expiry bigint)
RETURNS bytea LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT pg_catalog.int8send(seq)
        OPERATOR(pg_catalog.||) pg_catalog.int4send(pg_catalog.length(topic))
        OPERATOR(pg_catalog.||) topic
        OPERATOR(pg_catalog.||) pg_catalog.int4send(pg_catalog.length(envelope))
        OPERATOR(pg_catalog.||) envelope
        OPERATOR(pg_catalog.||) pg_catalog.substr(pg_catalog.int4send(
               (CASE WHEN payer IS NULL THEN 0 ELSE 1 END)
               OPERATOR(pg_catalog.+) (CASE WHEN gtime IS NULL THEN 0 ELSE 2 END)
               OPERATOR(pg_catalog.+) (CASE WHEN expiry IS NULL THEN 0 ELSE 4 END)), 4, 1)
        OPERATOR(pg_catalog.||) coalesce(pg_catalog.int4send(payer), ''::pg_catalog.bytea)
        OPERATOR(pg_catalog.||) coalesce(pg_catalog.timestamptz_send(gtime), ''::pg_catalog.bytea)
        OPERATOR(pg_catalog.||) coalesce(pg_catalog.int8send(expiry), ''::pg_catalog.bytea)
$$;

-- No SET search_path (applied on every call, it cost 9 us): every name is
-- qualified instead, operators included.
CREATE FUNCTION envelopes.insert_gateway_envelope(
    originator_node_id integer, originator_sequence_id bigint, topic bytea,
    originator_envelope bytea, payer_id integer DEFAULT NULL,
    gateway_time timestamptz DEFAULT now(), expiry bigint DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql
AS $$
BEGIN
    -- Refused here with one node's errors (every value then travels packed,
    -- binary: none is turned to text in this session's DateStyle or TimeZone).
    IF originator_node_id IS NULL THEN
        RAISE EXCEPTION 'originator_node_id must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF originator_sequence_id IS NULL THEN
        RAISE EXCEPTION 'originator_sequence_id must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF topic IS NULL THEN
        RAISE EXCEPTION 'topic must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF originator_envelope IS NULL THEN
        RAISE EXCEPTION 'originator_envelope must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    RETURN envelopes_router._insert_gateway_envelope_packed(
        originator_node_id,
        pg_catalog.encode(envelopes_router._packed_row(
            originator_sequence_id, topic, originator_envelope, payer_id, gateway_time, expiry),
            'base64'));
END;
$$;

-- A batch of one originator without the optional arrays (a gateway's usual
-- call), packed into one base64 value (see the shard's
-- insert_gateway_envelopes_packed). PL/Proxy passes every value as text: a
-- bytea[] of 100 envelopes costs the shard a parse of each of its characters
-- (more than the batch's own insert work for 272-byte envelopes), the base64
-- value a small part of that (bench/RESULTS.md, routerinstr). Called in the
-- target list: PL/Proxy's own form, a function in FROM, costs the shard more to
-- parse and plan on every call.
CREATE FUNCTION envelopes_router._insert_gateway_envelopes_packed(
    originator_node_id integer, packed_rows text)
RETURNS bigint LANGUAGE plproxy
AS $$
    CLUSTER 'envelopes_router_shards';
    RUN ON pg_catalog.hashint4(originator_node_id);
    SELECT envelopes.insert_gateway_envelopes_packed(originator_node_id, packed_rows);
$$;

-- A batch across originators, packed per originator: one base64 value of each
-- originator's rows, the arrays split by shard (PL/Proxy SPLIT). Each shard
-- inserts its originators' values in one statement, so its part is one
-- transaction there as with the arrays, and parses base64 text instead of every
-- character of the envelopes' hex. (unnest of several arrays is syntax of FROM,
-- which takes no schema.)
CREATE FUNCTION envelopes_router._insert_gateway_envelopes_packed_split(
    originator_node_ids integer[], packed_rows text[])
RETURNS SETOF bigint LANGUAGE plproxy
AS $$
    CLUSTER 'envelopes_router_shards';
    SPLIT originator_node_ids, packed_rows;
    RUN ON pg_catalog.hashint4(originator_node_ids);
    SELECT pg_catalog.sum(envelopes.insert_gateway_envelopes_packed(u.node, u.packed))::bigint
      FROM unnest(originator_node_ids, packed_rows) AS u(node, packed);
$$;

-- The batch insert: its shape checked here as one node checks it (so a batch
-- refused for a NULL or a length writes nothing anywhere), then packed and split
-- by shard; values are checked on each shard. Each shard's part is one transaction
-- there; the parts are not one transaction together, and a batch that failed on
-- one shard is completed by calling it again (every insert is idempotent).
CREATE FUNCTION envelopes.insert_gateway_envelopes(
    originator_node_ids integer[], originator_sequence_ids bigint[], topics bytea[],
    originator_envelopes bytea[], payer_ids integer[] DEFAULT NULL,
    gateway_times timestamptz[] DEFAULT NULL, expiries bigint[] DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n integer := coalesce(cardinality(originator_node_ids), 0);
    i integer;
    nodes integer[];
    packs text[];
BEGIN
    IF originator_node_ids IS NULL THEN
        RAISE EXCEPTION 'originator_node_ids must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF originator_sequence_ids IS NULL THEN
        RAISE EXCEPTION 'originator_sequence_ids must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF topics IS NULL THEN
        RAISE EXCEPTION 'topics must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF originator_envelopes IS NULL THEN
        RAISE EXCEPTION 'originator_envelopes must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF coalesce(cardinality(originator_sequence_ids), 0) <> n THEN
        RAISE EXCEPTION 'array originator_sequence_ids has % elements but originator_node_ids has %',
            cardinality(originator_sequence_ids), n USING ERRCODE = '2202E';
    END IF;
    IF coalesce(cardinality(topics), 0) <> n THEN
        RAISE EXCEPTION 'array topics has % elements but originator_node_ids has %',
            cardinality(topics), n USING ERRCODE = '2202E';
    END IF;
    IF coalesce(cardinality(originator_envelopes), 0) <> n THEN
        RAISE EXCEPTION 'array originator_envelopes has % elements but originator_node_ids has %',
            cardinality(originator_envelopes), n USING ERRCODE = '2202E';
    END IF;
    IF payer_ids IS NOT NULL AND coalesce(cardinality(payer_ids), 0) <> n THEN
        RAISE EXCEPTION 'array payer_ids has % elements but originator_node_ids has %',
            cardinality(payer_ids), n USING ERRCODE = '2202E';
    END IF;
    IF gateway_times IS NOT NULL AND coalesce(cardinality(gateway_times), 0) <> n THEN
        RAISE EXCEPTION 'array gateway_times has % elements but originator_node_ids has %',
            cardinality(gateway_times), n USING ERRCODE = '2202E';
    END IF;
    IF expiries IS NOT NULL AND coalesce(cardinality(expiries), 0) <> n THEN
        RAISE EXCEPTION 'array expiries has % elements but originator_node_ids has %',
            cardinality(expiries), n USING ERRCODE = '2202E';
    END IF;
    -- NULL elements are refused here, with one node's messages (the position
    -- counted from 1), so no shard stores its part of a batch refused for one.
    i := array_position(originator_node_ids, NULL);
    IF i IS NOT NULL THEN
        RAISE EXCEPTION 'originator_node_ids[%] must not be NULL',
            i - array_lower(originator_node_ids, 1) + 1 USING ERRCODE = 'null_value_not_allowed';
    END IF;
    i := array_position(originator_sequence_ids, NULL);
    IF i IS NOT NULL THEN
        RAISE EXCEPTION 'originator_sequence_ids[%] must not be NULL',
            i - array_lower(originator_sequence_ids, 1) + 1 USING ERRCODE = 'null_value_not_allowed';
    END IF;
    i := array_position(topics, NULL);
    IF i IS NOT NULL THEN
        RAISE EXCEPTION 'topics[%] must not be NULL',
            i - array_lower(topics, 1) + 1 USING ERRCODE = 'null_value_not_allowed';
    END IF;
    i := array_position(originator_envelopes, NULL);
    IF i IS NOT NULL THEN
        RAISE EXCEPTION 'originator_envelopes[%] must not be NULL',
            i - array_lower(originator_envelopes, 1) + 1 USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF n = 0 THEN
        RETURN 0;
    END IF;
    -- Packed: one value for a batch of one originator, one per originator
    -- otherwise (split by shard), each the originator's rows in batch order.
    SELECT array_agg(q.o ORDER BY q.first), array_agg(q.packed ORDER BY q.first)
      INTO nodes, packs
      FROM (SELECT u.o, min(u.i) AS first,
                   encode(string_agg(envelopes_router._packed_row(u.s, u.t, u.e, u.p, u.g, u.x),
                                     ''::bytea ORDER BY u.i), 'base64') AS packed
              FROM unnest(originator_node_ids, originator_sequence_ids, topics,
                          originator_envelopes, payer_ids, gateway_times, expiries)
                   WITH ORDINALITY AS u(o, s, t, e, p, g, x, i)
             GROUP BY u.o) q;
    IF cardinality(nodes) = 1 THEN
        RETURN envelopes_router._insert_gateway_envelopes_packed(nodes[1], packs[1]);
    END IF;
    RETURN (SELECT coalesce(sum(c), 0)::bigint
              FROM envelopes_router._insert_gateway_envelopes_packed_split(nodes, packs) c);
END;
$$;

CREATE FUNCTION envelopes.ensure_gateway_parts(
    originator_node_id integer, originator_sequence_id bigint, band_width bigint DEFAULT NULL)
RETURNS void LANGUAGE plproxy
AS $$
    CLUSTER 'envelopes_router_shards';
    RUN ON pg_catalog.hashint4(coalesce(originator_node_id, 0));
    TARGET envelopes.ensure_gateway_parts;
$$;

-- Outbox rows live on a shard like envelopes: on the shard of shard_key's
-- partition when one is given (an originator id, say, to keep a message with the
-- envelopes it is about), else on partition 0's shard.
CREATE FUNCTION envelopes_router._publish_hash(shard_key integer) RETURNS integer
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp
AS $$ SELECT coalesce(hashint4(shard_key), 0) $$;

CREATE FUNCTION envelopes.publish(subject text, payload bytea, headers jsonb DEFAULT '{}',
                                  shard_key integer DEFAULT NULL)
RETURNS bigint LANGUAGE plproxy
AS $$
    CLUSTER 'envelopes_router_shards';
    RUN ON envelopes_router._publish_hash(shard_key);
    SELECT envelopes.publish(subject, payload, headers) AS publish;
$$;

-- ---------------------------------------------------------------------------
-- The reader's functions: each shard answers for its originators, the router
-- merges. While a partition is being moved its rows exist on two shards, so the
-- merge removes repeats (they are the same rows).
-- ---------------------------------------------------------------------------

CREATE FUNCTION envelopes_router._select_gateway_envelopes(
    cursor_node_ids integer[], cursor_sequence_ids bigint[], topics bytea[],
    originator_node_ids integer[], row_limit integer)
RETURNS TABLE (originator_node_id integer, originator_sequence_id bigint,
               gateway_time timestamptz, topic bytea, payer_id integer, expiry bigint,
               originator_envelope bytea)
LANGUAGE plproxy
AS $$
    CLUSTER 'envelopes_router_shards';
    RUN ON envelopes_router._hashes(originator_node_ids);
    TARGET envelopes.select_gateway_envelopes;
$$;

-- A connection string, if it is a shard of the map (readers may call
-- _select_at, and PL/Proxy connects to whatever it is given: only to shards).
CREATE FUNCTION envelopes_router._known_shard(shard text) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM envelopes_router.partition_map m
                    WHERE m.shard = _known_shard.shard OR m.previous_shard = _known_shard.shard) THEN
        RAISE EXCEPTION 'not a shard of the router' USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN shard;
END;
$$;

-- One shard's answer, on the shard a connection string names.
CREATE FUNCTION envelopes_router._select_at(
    shard text, cursor_node_ids integer[], cursor_sequence_ids bigint[], topics bytea[],
    originator_node_ids integer[], row_limit integer)
RETURNS TABLE (originator_node_id integer, originator_sequence_id bigint,
               gateway_time timestamptz, topic bytea, payer_id integer, expiry bigint,
               originator_envelope bytea)
LANGUAGE plproxy
AS $$
    CONNECT envelopes_router._known_shard(shard);
    SELECT * FROM envelopes.select_gateway_envelopes(cursor_node_ids, cursor_sequence_ids,
                                                     topics, originator_node_ids, row_limit);
$$;

-- Every originator with a partition, on every shard: the list partitions of the
-- meta table, read from the catalog (a millisecond; partitions() also sizes every
-- band).
CREATE FUNCTION envelopes_router._originators()
RETURNS TABLE (originator_node_id integer)
LANGUAGE plproxy
AS $$
    CLUSTER 'envelopes_router_shards';
    RUN ON ALL;
    SELECT (pg_catalog.regexp_match(pg_catalog.pg_get_expr(c.relpartbound, c.oid),
                                    '^FOR VALUES IN \((\d+)\)$'))[1]::integer AS originator_node_id
      FROM pg_catalog.pg_inherits i
      JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid
     WHERE i.inhparent = 'envelopes.gateway_envelopes_meta'::pg_catalog.regclass;
$$;

-- The fan-out: every shard concerned returns its first row_limit rows after the
-- cursor; the first row_limit of their merge are the first row_limit of all (a
-- row among those has fewer than row_limit rows before it on its own shard).
-- Repeats (a partition being moved is on two shards) are removed.
CREATE FUNCTION envelopes_router._select_merged(
    cursor_node_ids integer[], cursor_sequence_ids bigint[], topics bytea[],
    originator_node_ids integer[], row_limit integer)
RETURNS TABLE (originator_node_id integer, originator_sequence_id bigint,
               gateway_time timestamptz, topic bytea, payer_id integer, expiry bigint,
               originator_envelope bytea)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
AS $$
    SELECT DISTINCT ON (r.originator_node_id, r.originator_sequence_id) r.*
      FROM envelopes_router._select_gateway_envelopes(
               cursor_node_ids, cursor_sequence_ids, topics, originator_node_ids, row_limit) r
     ORDER BY r.originator_node_id, r.originator_sequence_id
     LIMIT row_limit
$$;

-- The rows come in originator order and every originator lives on one shard, so
-- the router walks the originators in order, grouped into runs that share a
-- shard, and asks each run's shard only for the rows still missing: a read that
-- one originator fills costs one shard one call. Past a few runs (many small
-- originators spread over the shards) it asks all the remaining shards at once
-- and merges. While a partition is being moved, it always merges (the rows may
-- be on either shard for a while).
CREATE FUNCTION envelopes.select_gateway_envelopes(
    cursor_node_ids integer[] DEFAULT '{}', cursor_sequence_ids bigint[] DEFAULT '{}',
    topics bytea[] DEFAULT NULL, originator_node_ids integer[] DEFAULT NULL,
    row_limit integer DEFAULT 1000)
RETURNS TABLE (originator_node_id integer, originator_sequence_id bigint,
               gateway_time timestamptz, topic bytea, payer_id integer, expiry bigint,
               originator_envelope bytea)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    wanted integer[];
    parts integer;
    remaining integer := row_limit;
    run integer[] := '{}';
    run_shard text;
    calls integer := 0;
    got bigint;
    r record;
BEGIN
    IF row_limit IS NULL OR row_limit < 0 THEN
        -- The shards reject it, with their own message and SQLSTATE.
        RETURN QUERY SELECT * FROM envelopes_router._select_gateway_envelopes(
            cursor_node_ids, cursor_sequence_ids, topics, originator_node_ids, row_limit);
        RETURN;
    END IF;
    IF row_limit = 0
       OR cardinality(topics) = 0 OR cardinality(originator_node_ids) = 0
       OR array_position(originator_node_ids, NULL) IS NOT NULL
       OR EXISTS (SELECT 1 FROM envelopes_router.partition_map m WHERE m.previous_shard IS NOT NULL) THEN
        RETURN QUERY SELECT * FROM envelopes_router._select_merged(
            cursor_node_ids, cursor_sequence_ids, topics, originator_node_ids, row_limit);
        RETURN;
    END IF;
    IF originator_node_ids IS NULL THEN
        SELECT array_agg(DISTINCT o.originator_node_id ORDER BY o.originator_node_id) INTO wanted
          FROM envelopes_router._originators() o WHERE o.originator_node_id IS NOT NULL;
    ELSE
        SELECT array_agg(DISTINCT o ORDER BY o) INTO wanted FROM unnest(originator_node_ids) o;
    END IF;
    IF wanted IS NULL THEN
        -- No originator anywhere: the shards still check the arguments.
        RETURN QUERY SELECT * FROM envelopes_router._select_merged(
            cursor_node_ids, cursor_sequence_ids, topics, originator_node_ids, row_limit);
        RETURN;
    END IF;
    parts := (SELECT count(*) FROM envelopes_router.partition_map)::integer;
    FOR r IN
        SELECT o.o AS originator, m.shard
          FROM unnest(wanted) o
          JOIN envelopes_router.partition_map m ON m.partition = hashint4(o.o) & (parts - 1)
         ORDER BY o.o
    LOOP
        IF r.shard IS DISTINCT FROM run_shard AND cardinality(run) > 0 THEN
            IF calls >= 3 THEN
                -- Many runs: the rest in one fan-out.
                RETURN QUERY SELECT * FROM envelopes_router._select_merged(
                    cursor_node_ids, cursor_sequence_ids, topics,
                    ARRAY(SELECT w FROM unnest(wanted) w WHERE w >= run[1]), remaining);
                RETURN;
            END IF;
            RETURN QUERY SELECT * FROM envelopes_router._select_at(
                run_shard, cursor_node_ids, cursor_sequence_ids, topics, run, remaining);
            GET DIAGNOSTICS got = ROW_COUNT;
            remaining := remaining - got;
            calls := calls + 1;
            IF remaining <= 0 THEN
                RETURN;
            END IF;
            run := '{}';
        END IF;
        run_shard := r.shard;
        run := run || r.originator;
    END LOOP;
    RETURN QUERY SELECT * FROM envelopes_router._select_at(
        run_shard, cursor_node_ids, cursor_sequence_ids, topics, run, remaining);
END;
$$;

CREATE FUNCTION envelopes_router._originator_ceilings()
RETURNS TABLE (originator_node_id integer, max_sequence_id bigint)
LANGUAGE plproxy
AS $$
    CLUSTER 'envelopes_router_shards';
    RUN ON ALL;
    TARGET envelopes.originator_ceilings;
$$;

CREATE FUNCTION envelopes.originator_ceilings()
RETURNS TABLE (originator_node_id integer, max_sequence_id bigint)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
AS $$
    SELECT c.originator_node_id, max(c.max_sequence_id)
      FROM envelopes_router._originator_ceilings() c
     GROUP BY c.originator_node_id
     ORDER BY c.originator_node_id
$$;

-- Partition names travel as text: a regclass is an OID, meaningful only on its
-- own shard.
CREATE FUNCTION envelopes_router._partitions()
RETURNS TABLE (originator_node_id integer, band_start bigint, band_end bigint,
               meta_partition text, blob_partition text, row_estimate bigint,
               total_bytes bigint, shard text)
LANGUAGE plproxy
AS $$
    CLUSTER 'envelopes_router_shards';
    RUN ON ALL;
    SELECT p.originator_node_id, p.band_start, p.band_end, p.meta_partition::text AS meta_partition,
           p.blob_partition::text AS blob_partition, p.row_estimate, p.total_bytes,
           pg_catalog.current_database() || '@' || coalesce(pg_catalog.host(pg_catalog.inet_server_addr()), 'local')
               || ':' || pg_catalog.current_setting('port') AS shard
      FROM envelopes.partitions() p;
$$;

CREATE FUNCTION envelopes.partitions()
RETURNS TABLE (originator_node_id integer, band_start bigint, band_end bigint,
               meta_partition text, blob_partition text, row_estimate bigint,
               total_bytes bigint, shard text)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
AS $$
    SELECT * FROM envelopes_router._partitions() p
     ORDER BY p.originator_node_id, p.band_start, p.shard
$$;

-- ---------------------------------------------------------------------------
-- xmtpd's read shapes (the extension's select_by_topic_cursors, select_wave,
-- select_newest_by_topic, select_originator, originator_maxima). Every shard
-- answers for its own originators and the router merges, as for
-- select_gateway_envelopes: a shard's first row_limit rows in key order hold
-- every row of the first row_limit of all that lives on that shard (cursor
-- entries and ceilings are per originator, and an originator lives on one
-- shard). Repeats, while a partition is being moved, are removed. A negative or
-- NULL limit goes to the shards unchanged, so they refuse it as one node does.
-- ---------------------------------------------------------------------------

CREATE FUNCTION envelopes_router._limit(row_limit integer) RETURNS integer
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp
AS $$ SELECT CASE WHEN row_limit >= 0 THEN row_limit END $$;

-- Whether a partition is being moved (its rows may be on two shards).
CREATE FUNCTION envelopes_router._moving() RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
AS $$ SELECT EXISTS (SELECT 1 FROM envelopes_router.partition_map WHERE previous_shard IS NOT NULL) $$;

CREATE FUNCTION envelopes_router._select_by_topic_cursors(
    cursor_topics bytea[], cursor_node_ids integer[], cursor_sequence_ids bigint[],
    rows_per_entry integer, row_limit integer, commit_safe boolean)
RETURNS TABLE (originator_node_id integer, originator_sequence_id bigint,
               gateway_time timestamptz, topic bytea, payer_id integer, expiry bigint,
               originator_envelope bytea)
LANGUAGE plproxy
AS $$
    CLUSTER 'envelopes_router_shards';
    RUN ON ALL;
    TARGET envelopes.select_by_topic_cursors;
$$;

CREATE FUNCTION envelopes.select_by_topic_cursors(
    cursor_topics bytea[], cursor_node_ids integer[], cursor_sequence_ids bigint[],
    rows_per_entry integer DEFAULT 1000, row_limit integer DEFAULT 1000,
    commit_safe boolean DEFAULT false)
RETURNS TABLE (originator_node_id integer, originator_sequence_id bigint,
               gateway_time timestamptz, topic bytea, payer_id integer, expiry bigint,
               originator_envelope bytea)
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
    SELECT DISTINCT ON (r.originator_node_id, r.originator_sequence_id) r.*
      FROM envelopes_router._select_by_topic_cursors($1, $2, $3, $4, $5, $6) r
     ORDER BY r.originator_node_id, r.originator_sequence_id
     LIMIT envelopes_router._limit($5)
$$;

CREATE FUNCTION envelopes_router._select_wave(
    cursor_topics bytea[], cursor_node_ids integer[], cursor_sequence_ids bigint[],
    ceiling_node_ids integer[], ceiling_sequence_ids bigint[], after_node_id integer,
    after_sequence_id bigint, row_limit integer, commit_safe boolean)
RETURNS TABLE (originator_node_id integer, originator_sequence_id bigint,
               gateway_time timestamptz, topic bytea, payer_id integer, expiry bigint,
               originator_envelope bytea)
LANGUAGE plproxy
AS $$
    CLUSTER 'envelopes_router_shards';
    RUN ON ALL;
    TARGET envelopes.select_wave;
$$;

CREATE FUNCTION envelopes.select_wave(
    cursor_topics bytea[], cursor_node_ids integer[], cursor_sequence_ids bigint[],
    ceiling_node_ids integer[], ceiling_sequence_ids bigint[],
    after_node_id integer DEFAULT NULL, after_sequence_id bigint DEFAULT NULL,
    row_limit integer DEFAULT 1000, commit_safe boolean DEFAULT false)
RETURNS TABLE (originator_node_id integer, originator_sequence_id bigint,
               gateway_time timestamptz, topic bytea, payer_id integer, expiry bigint,
               originator_envelope bytea)
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
    SELECT DISTINCT ON (r.originator_node_id, r.originator_sequence_id) r.*
      FROM envelopes_router._select_wave($1, $2, $3, $4, $5, $6, $7, $8, $9) r
     ORDER BY r.originator_node_id, r.originator_sequence_id
     LIMIT envelopes_router._limit($8)
$$;

CREATE FUNCTION envelopes_router._select_newest_by_topic(topics bytea[])
RETURNS TABLE (originator_node_id integer, originator_sequence_id bigint,
               gateway_time timestamptz, topic bytea, payer_id integer, expiry bigint,
               originator_envelope bytea)
LANGUAGE plproxy
AS $$
    CLUSTER 'envelopes_router_shards';
    RUN ON ALL;
    TARGET envelopes.select_newest_by_topic;
$$;

-- Each shard answers with its best row per topic by the extension's rule (the
-- latest gateway_time among each originator's highest sequence id on the topic,
-- a tie to the higher originator); the best of those is the best of all.
CREATE FUNCTION envelopes.select_newest_by_topic(topics bytea[])
RETURNS TABLE (originator_node_id integer, originator_sequence_id bigint,
               gateway_time timestamptz, topic bytea, payer_id integer, expiry bigint,
               originator_envelope bytea)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
AS $$
    SELECT DISTINCT ON (r.topic) r.*
      FROM envelopes_router._select_newest_by_topic($1) r
     ORDER BY r.topic, r.gateway_time DESC, r.originator_node_id DESC,
              r.originator_sequence_id DESC
$$;

-- One originator lives on one shard: one call there, unless a partition is being
-- moved (then every shard, merged).
CREATE FUNCTION envelopes_router._select_originator_on(
    node integer, after_sequence_id bigint, row_limit integer, commit_safe boolean)
RETURNS TABLE (originator_node_id integer, originator_sequence_id bigint,
               gateway_time timestamptz, topic bytea, payer_id integer, expiry bigint,
               originator_envelope bytea)
LANGUAGE plproxy
AS $$
    CLUSTER 'envelopes_router_shards';
    -- A NULL id goes to partition 0's shard, which rejects it as one node does.
    RUN ON pg_catalog.hashint4(coalesce(node, 0));
    TARGET envelopes.select_originator;
$$;

CREATE FUNCTION envelopes_router._select_originator_all(
    node integer, after_sequence_id bigint, row_limit integer, commit_safe boolean)
RETURNS TABLE (originator_node_id integer, originator_sequence_id bigint,
               gateway_time timestamptz, topic bytea, payer_id integer, expiry bigint,
               originator_envelope bytea)
LANGUAGE plproxy
AS $$
    CLUSTER 'envelopes_router_shards';
    RUN ON ALL;
    TARGET envelopes.select_originator;
$$;

-- The test of _moving() has no column in it: the planner evaluates it once,
-- before either branch runs, and only one branch calls the shards.
CREATE FUNCTION envelopes.select_originator(
    originator_node_id integer, after_sequence_id bigint DEFAULT 0,
    row_limit integer DEFAULT 1000, commit_safe boolean DEFAULT false)
RETURNS TABLE (originator_node_id integer, originator_sequence_id bigint,
               gateway_time timestamptz, topic bytea, payer_id integer, expiry bigint,
               originator_envelope bytea)
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
    SELECT * FROM envelopes_router._select_originator_on($1, $2, $3, $4)
     WHERE NOT envelopes_router._moving()
    UNION ALL
    (SELECT DISTINCT ON (r.originator_sequence_id) r.*
       FROM envelopes_router._select_originator_all($1, $2, $3, $4) r
      WHERE envelopes_router._moving()
      ORDER BY r.originator_sequence_id
      LIMIT envelopes_router._limit($3))
$$;

CREATE FUNCTION envelopes_router._originator_maxima(originator_node_ids integer[])
RETURNS TABLE (originator_node_id integer, max_sequence_id bigint)
LANGUAGE plproxy
AS $$
    CLUSTER 'envelopes_router_shards';
    RUN ON ALL;
    TARGET envelopes.originator_maxima;
$$;

-- Every shard answers for every given originator (0 where it holds none of its
-- rows); the highest answer is the originator's.
CREATE FUNCTION envelopes.originator_maxima(originator_node_ids integer[])
RETURNS TABLE (originator_node_id integer, max_sequence_id bigint)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
AS $$
    SELECT m.originator_node_id, max(m.max_sequence_id)
      FROM envelopes_router._originator_maxima($1) m
     GROUP BY m.originator_node_id
     ORDER BY m.originator_node_id
$$;

-- ---------------------------------------------------------------------------
-- Consumers: a bridge runs per shard, against the shard itself; the router
-- registers a consumer everywhere and sums what is pending.
-- ---------------------------------------------------------------------------

CREATE FUNCTION envelopes.consumer_register(name text, from_start boolean DEFAULT true)
RETURNS SETOF void LANGUAGE plproxy
AS $$
    CLUSTER 'envelopes_router_shards';
    RUN ON ALL;
    TARGET envelopes.consumer_register;
$$;

CREATE FUNCTION envelopes_router._consumer_envelopes_pending(consumer text)
RETURNS TABLE (pending bigint, oldest timestamptz)
LANGUAGE plproxy
AS $$
    CLUSTER 'envelopes_router_shards';
    RUN ON ALL;
    TARGET envelopes.consumer_envelopes_pending;
$$;

CREATE FUNCTION envelopes.consumer_envelopes_pending(consumer text)
RETURNS TABLE (pending bigint, oldest timestamptz)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce(sum(p.pending), 0)::bigint, min(p.oldest)
      FROM envelopes_router._consumer_envelopes_pending(consumer) p
$$;

-- ---------------------------------------------------------------------------
-- Moving a partition to another shard while writes go on.
-- ---------------------------------------------------------------------------

-- The originators that have bands on a shard.
CREATE FUNCTION envelopes_router._originators_at(shard text)
RETURNS TABLE (originator_node_id integer)
LANGUAGE plproxy
AS $$
    CONNECT shard;
    SELECT DISTINCT p.originator_node_id FROM envelopes.partitions() p;
$$;

CREATE FUNCTION envelopes_router._write_at(shard text,
    originator_node_ids integer[], originator_sequence_ids bigint[], topics bytea[],
    originator_envelopes bytea[], payer_ids integer[], gateway_times timestamptz[],
    expiries bigint[])
RETURNS bigint LANGUAGE plproxy
AS $$
    CONNECT shard;
    SELECT envelopes.insert_gateway_envelopes(originator_node_ids, originator_sequence_ids,
        topics, originator_envelopes, payer_ids, gateway_times, expiries) AS _write_at;
$$;

-- Copies every row of the partition's originators from one shard to another
-- (idempotent inserts: rows already there count 0). Returns the rows inserted.
CREATE FUNCTION envelopes_router._copy_partition(partition integer, source text, target text,
                                                 page integer DEFAULT 1000)
RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    parts integer := (SELECT count(*) FROM envelopes_router.partition_map);
    originator integer;
    after bigint;
    copied bigint := 0;
    b record;
BEGIN
    FOR originator IN
        SELECT c.originator_node_id FROM envelopes_router._originators_at(source) c
         WHERE hashint4(c.originator_node_id) & (parts - 1) = partition
         ORDER BY 1
    LOOP
        after := 0;
        LOOP
            SELECT array_agg(r.originator_node_id ORDER BY r.originator_sequence_id) AS ids,
                   array_agg(r.originator_sequence_id ORDER BY r.originator_sequence_id) AS seqs,
                   array_agg(r.topic ORDER BY r.originator_sequence_id) AS topics,
                   array_agg(r.originator_envelope ORDER BY r.originator_sequence_id) AS envs,
                   array_agg(r.payer_id ORDER BY r.originator_sequence_id) AS payers,
                   array_agg(r.gateway_time ORDER BY r.originator_sequence_id) AS times,
                   array_agg(r.expiry ORDER BY r.originator_sequence_id) AS expiries,
                   max(r.originator_sequence_id) AS last
              INTO b
              FROM envelopes_router._select_at(source, ARRAY[originator], ARRAY[after], NULL,
                                                 ARRAY[originator], page) r;
            EXIT WHEN b.last IS NULL;
            copied := copied + envelopes_router._write_at(target, b.ids, b.seqs, b.topics, b.envs,
                                                          b.payers, b.times, b.expiries);
            after := b.last;
        END LOOP;
    END LOOP;
    RETURN copied;
END;
$$;

-- Moves one partition to new_shard (a connection string; the shard must have
-- pg_envelopes installed) while writes go on:
--   1. copy the partition's originators from the old shard to the new one;
--   2. switch the map (committed: new calls go to the new shard);
--   3. wait until every transaction of this proxy database that started before
--      the switch has ended (a write routed by the old map has then reached the
--      old shard and committed or failed);
--   4. copy again (what landed on the old shard meanwhile);
--   5. verify: a last pass finds nothing left to copy.
-- The old shard keeps its copy (reads through the router show each row once);
-- drop its bands there once the move is verified. With several proxy databases,
-- step 3 must hold on each of them: stop routing through the others while moving.
CREATE PROCEDURE envelopes_router.move_partition(partition integer, new_shard text,
                                                 wait_seconds integer DEFAULT 60,
                                                 from_shard text DEFAULT NULL)
LANGUAGE plpgsql
AS $$
DECLARE
    old_shard text;
    switched timestamptz;
    copied bigint;
    waited integer := 0;
BEGIN
    SET LOCAL search_path = pg_catalog, pg_temp;
    SELECT m.shard INTO old_shard FROM envelopes_router.partition_map m WHERE m.partition = move_partition.partition;
    IF old_shard IS NULL THEN
        RAISE EXCEPTION 'partition % is not in the map', partition
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF new_shard IS NULL OR new_shard = '' THEN
        RAISE EXCEPTION 'new_shard must be a connection string' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF old_shard = new_shard AND from_shard IS NULL THEN
        RAISE NOTICE 'partition % is already on that shard', partition;
        RETURN;
    END IF;
    IF old_shard = new_shard THEN
        -- A move that timed out waiting, resumed: the map is switched already.
        old_shard := from_shard;
        switched := clock_timestamp();
    ELSE
        copied := envelopes_router._copy_partition(partition, old_shard, new_shard);
        RAISE NOTICE 'partition %: % rows copied before the switch', partition, copied;
        COMMIT;

        SET LOCAL search_path = pg_catalog, pg_temp;
        UPDATE envelopes_router.partition_map m SET shard = new_shard, previous_shard = old_shard
         WHERE m.partition = move_partition.partition;
        PERFORM envelopes_router._sync_server();
        switched := clock_timestamp();
        COMMIT;
    END IF;

    SET LOCAL search_path = pg_catalog, pg_temp;
    LOOP
        PERFORM pg_stat_clear_snapshot();
        EXIT WHEN NOT EXISTS (
            SELECT 1 FROM pg_stat_activity a
             WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
               AND a.xact_start < switched);
        IF waited >= wait_seconds * 10 THEN
            RAISE EXCEPTION 'transactions older than the switch of partition % are still open after % s',
                partition, wait_seconds
                USING ERRCODE = 'lock_not_available',
                      HINT = format('The map is switched; once they end, CALL envelopes_router.move_partition(%s, %L, from_shard => %L) copies what they wrote.',
                                    partition, new_shard, old_shard);
        END IF;
        PERFORM pg_sleep(0.1);
        waited := waited + 1;
    END LOOP;
    copied := envelopes_router._copy_partition(partition, old_shard, new_shard);
    RAISE NOTICE 'partition %: % rows copied after the switch', partition, copied;
    -- Verify: one more pass finds nothing to copy, so every row the old shard
    -- holds for the partition is on the new one. Rows here mean something still
    -- writes to the old shard (another proxy database on the old map).
    copied := envelopes_router._copy_partition(partition, old_shard, new_shard);
    IF copied > 0 THEN
        RAISE EXCEPTION 'partition %: % rows reached the old shard after the switch', partition, copied
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = format('Something routes with the old map (another proxy database?); stop it, then CALL envelopes_router.move_partition(%s, %L, from_shard => %L).',
                                partition, new_shard, old_shard);
    END IF;
    -- Verified: reads go back to asking only the partition's shard.
    UPDATE envelopes_router.partition_map m SET previous_shard = NULL
     WHERE m.partition = move_partition.partition;
    COMMIT;
END;
$$;

-- ---------------------------------------------------------------------------
-- Privileges: nothing is callable by PUBLIC; grant_writer / grant_reader give a
-- role the routed functions and the cluster (the role connects to the shards
-- under its own name, so grant it there too, with the shards' own grant_writer
-- or grant_reader).
-- ---------------------------------------------------------------------------

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA envelopes FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA envelopes_router FROM PUBLIC;
REVOKE ALL ON PROCEDURE envelopes_router.move_partition(integer, text, integer, text) FROM PUBLIC;

CREATE FUNCTION envelopes.grant_writer(role name) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM envelopes.grant_reader(role);
    EXECUTE format('GRANT EXECUTE ON FUNCTION
        envelopes.insert_gateway_envelope(integer, bigint, bytea, bytea, integer, timestamptz, bigint),
        envelopes.insert_gateway_envelopes(integer[], bigint[], bytea[], bytea[], integer[], timestamptz[], bigint[]),
        envelopes_router._insert_gateway_envelopes_packed(integer, text),
        envelopes_router._insert_gateway_envelopes_packed_split(integer[], text[]),
        envelopes_router._packed_row(bigint, bytea, bytea, integer, timestamptz, bigint),
        envelopes_router._insert_gateway_envelope_packed(integer, text),
        envelopes.ensure_gateway_parts(integer, bigint, bigint),
        envelopes.publish(text, bytea, jsonb, integer),
        envelopes_router._publish_hash(integer) TO %I', role);
END;
$$;

CREATE FUNCTION envelopes.grant_reader(role name) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA envelopes, envelopes_router TO %I', role);
    EXECUTE format('GRANT USAGE ON FOREIGN SERVER envelopes_router_shards TO %I', role);
    EXECUTE format('GRANT SELECT ON envelopes_router.partition_map TO %I', role);
    EXECUTE format('GRANT EXECUTE ON FUNCTION
        envelopes_router._hashes(integer[]),
        envelopes_router.partition_of(integer),
        envelopes_router.shard_of(integer),
        envelopes_router.shards(),
        envelopes.select_gateway_envelopes(integer[], bigint[], bytea[], integer[], integer),
        envelopes_router._select_gateway_envelopes(integer[], bigint[], bytea[], integer[], integer),
        envelopes_router._select_merged(integer[], bigint[], bytea[], integer[], integer),
        envelopes_router._select_at(text, integer[], bigint[], bytea[], integer[], integer),
        envelopes_router._originators(),
        envelopes_router._known_shard(text),
        envelopes.originator_ceilings(),
        envelopes_router._originator_ceilings(),
        envelopes.partitions(),
        envelopes_router._partitions(),
        envelopes_router._limit(integer),
        envelopes_router._moving(),
        envelopes.select_by_topic_cursors(bytea[], integer[], bigint[], integer, integer, boolean),
        envelopes_router._select_by_topic_cursors(bytea[], integer[], bigint[], integer, integer, boolean),
        envelopes.select_wave(bytea[], integer[], bigint[], integer[], bigint[], integer, bigint, integer, boolean),
        envelopes_router._select_wave(bytea[], integer[], bigint[], integer[], bigint[], integer, bigint, integer, boolean),
        envelopes.select_newest_by_topic(bytea[]),
        envelopes_router._select_newest_by_topic(bytea[]),
        envelopes.select_originator(integer, bigint, integer, boolean),
        envelopes_router._select_originator_on(integer, bigint, integer, boolean),
        envelopes_router._select_originator_all(integer, bigint, integer, boolean),
        envelopes.originator_maxima(integer[]),
        envelopes_router._originator_maxima(integer[]) TO %I', role);
END;
$$;

REVOKE ALL ON FUNCTION envelopes.grant_writer(name), envelopes.grant_reader(name) FROM PUBLIC;
