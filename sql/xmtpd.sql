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
