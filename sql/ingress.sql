-- Ingress positions: how far each ingress consumer has stored each bus stream. The
-- bridge writes the position in the same transaction as the envelopes it read up to
-- it, so a stored position never covers an envelope whose insert did not commit.
-- A position is per (consumer, stream): one name used for two streams keeps two
-- positions, and a position of one stream never stands in for the other's.
-- owner is the role that first stored that position: only that role (its members)
-- and the extension's owner move it. NULL only for positions stored before 0.4.0,
-- until the next store claims it. A regrole, so that a dump names the role
-- (see consumers.owner).
-- stream_identity says which incarnation of the stream the position counts in (for
-- JetStream, the stream's creation time): a stream deleted and re-created under the
-- same name numbers its messages from 1 again, and a position of the old one would
-- skip the new one's first messages. NULL when the writer did not say (the
-- three-argument ingress_store_position, or positions stored before 0.4.0).

CREATE TABLE ingress_positions (
    consumer   text        NOT NULL CHECK (consumer <> ''),
    stream     text        NOT NULL,
    position   bigint      NOT NULL CHECK (position >= 0),
    updated_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    owner      regrole,
    stream_identity text,
    CONSTRAINT ingress_positions_pkey PRIMARY KEY (consumer, stream)
);
COMMENT ON TABLE ingress_positions IS
    'Last bus stream sequence each ingress consumer stored per stream, committed with the envelopes.';

-- Refuses NULL and empty names (22004, 22023), as every consumer function does.
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

-- The stored position of a consumer on a stream (0 when it has none yet).
CREATE FUNCTION ingress_position(consumer text, stream text)
RETURNS bigint LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM @extschema@._check_ingress_names(consumer, stream);
    RETURN COALESCE((SELECT p.position FROM @extschema@.ingress_positions p
                      WHERE p.consumer = ingress_position.consumer
                        AND p.stream = ingress_position.stream), 0);
END $$;

-- Moves a consumer's position on a stream forward (never backwards). Call it in
-- the transaction that inserts the envelopes read up to that position. Refused
-- with 42501 for a position another role owns, and with 55006 while another
-- session holds the ingress lease of that consumer and stream (ingress_lease).
CREATE FUNCTION ingress_store_position(consumer text, stream text, new_position bigint)
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

-- Makes this session the active ingress of a consumer on a stream, unless another
-- session already is: (true, NULL) when this session holds the lease now,
-- (false, pid) when the session with that backend pid holds it (pid 0: unknown).
-- The lease lasts until the session ends (or ingress_lease_release); while it is
-- held, ingress_store_position from any other session fails with 55006, so two
-- bridges under one name never both store. Refused (42501) for a position another
-- role owns.
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

-- Gives up this session's ingress lease (true if it held it).
CREATE FUNCTION ingress_lease_release(consumer text, stream text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM @extschema@._check_ingress_names(consumer, stream);
    RETURN @extschema@._lease_release('ingress', consumer, stream);
END $$;

-- pg_dump carries this state (see "Backup, restore and moving hosts" in the docs):
-- a table created by an extension is otherwise left out of every dump.
SELECT pg_catalog.pg_extension_config_dump('@extschema@.ingress_positions', '');
