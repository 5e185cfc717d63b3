-- The read functions. Their bodies are in Rust (src/select.rs, src/shapes.rs)
-- and return the whole result in one call (materialize mode, src/srf.rs), which
-- pgrx's generated definitions cannot express, so they are declared here. None
-- runs SQL: they scan the band leaves' indexes directly, with the calling
-- statement's snapshot (or, with commit_safe, one taken after the ceilings).
-- Those with a commit-safe form are SECURITY DEFINER, without a SET clause,
-- because that form samples the change feed's sequences; see sql/roles.sql.

-- Envelopes after a vector-clock cursor (README: select_gateway_envelopes).
CREATE FUNCTION select_gateway_envelopes(
    cursor_node_ids integer[] DEFAULT '{}',
    cursor_sequence_ids bigint[] DEFAULT '{}',
    topics bytea[] DEFAULT NULL,
    originator_node_ids integer[] DEFAULT NULL,
    row_limit integer DEFAULT 1000
) RETURNS TABLE (
    originator_node_id integer,
    originator_sequence_id bigint,
    gateway_time timestamp with time zone,
    topic bytea,
    payer_id integer,
    expiry bigint,
    originator_envelope bytea
)
STABLE PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'select_gateway_envelopes_wrapper';

-- xmtpd's read shapes (README: the read shapes of an xmtpd node).
CREATE FUNCTION select_by_topic_cursors(
    cursor_topics bytea[],
    cursor_node_ids integer[],
    cursor_sequence_ids bigint[],
    rows_per_entry integer DEFAULT 1000,
    row_limit integer DEFAULT 1000,
    commit_safe boolean DEFAULT false
) RETURNS TABLE (
    originator_node_id integer,
    originator_sequence_id bigint,
    gateway_time timestamp with time zone,
    topic bytea,
    payer_id integer,
    expiry bigint,
    originator_envelope bytea
)
VOLATILE PARALLEL UNSAFE SECURITY DEFINER
LANGUAGE c AS 'MODULE_PATHNAME', 'select_by_topic_cursors_wrapper';

CREATE FUNCTION select_wave(
    cursor_topics bytea[],
    cursor_node_ids integer[],
    cursor_sequence_ids bigint[],
    ceiling_node_ids integer[],
    ceiling_sequence_ids bigint[],
    after_node_id integer DEFAULT NULL,
    after_sequence_id bigint DEFAULT NULL,
    row_limit integer DEFAULT 1000,
    commit_safe boolean DEFAULT false
) RETURNS TABLE (
    originator_node_id integer,
    originator_sequence_id bigint,
    gateway_time timestamp with time zone,
    topic bytea,
    payer_id integer,
    expiry bigint,
    originator_envelope bytea
)
VOLATILE PARALLEL UNSAFE SECURITY DEFINER
LANGUAGE c AS 'MODULE_PATHNAME', 'select_wave_wrapper';

CREATE FUNCTION select_newest_by_topic(topics bytea[])
RETURNS TABLE (
    originator_node_id integer,
    originator_sequence_id bigint,
    gateway_time timestamp with time zone,
    topic bytea,
    payer_id integer,
    expiry bigint,
    originator_envelope bytea
)
STABLE PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'select_newest_by_topic_wrapper';

CREATE FUNCTION select_originator(
    originator_node_id integer,
    after_sequence_id bigint DEFAULT 0,
    row_limit integer DEFAULT 1000,
    commit_safe boolean DEFAULT false
) RETURNS TABLE (
    originator_node_id integer,
    originator_sequence_id bigint,
    gateway_time timestamp with time zone,
    topic bytea,
    payer_id integer,
    expiry bigint,
    originator_envelope bytea
)
VOLATILE PARALLEL UNSAFE SECURITY DEFINER
LANGUAGE c AS 'MODULE_PATHNAME', 'select_originator_wrapper';

CREATE FUNCTION originator_maxima(originator_node_ids integer[])
RETURNS TABLE (originator_node_id integer, max_sequence_id bigint)
STABLE PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'originator_maxima_wrapper';
