-- Ingress positions: how far each ingress consumer has stored a bus stream. The
-- bridge writes the position in the same transaction as the envelopes it read up to
-- it, so a stored position never covers an envelope whose insert did not commit.
-- owner is the role that first stored a position for the consumer: only that role
-- (its members) and the extension's owner move it. NULL only for positions stored
-- before 0.4.0, until the next store claims it.

CREATE TABLE ingress_positions (
    consumer   text        PRIMARY KEY CHECK (consumer <> ''),
    stream     text        NOT NULL,
    position   bigint      NOT NULL CHECK (position >= 0),
    updated_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    owner      oid
);
COMMENT ON TABLE ingress_positions IS
    'Last bus stream sequence each ingress consumer stored, committed with the envelopes.';

-- The stored position of a consumer on a stream (0 when it has none yet).
CREATE FUNCTION ingress_position(consumer text, stream text)
RETURNS bigint LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF consumer IS NULL OR stream IS NULL THEN
        RAISE EXCEPTION 'consumer and stream must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    RETURN COALESCE((SELECT p.position FROM @extschema@.ingress_positions p
                      WHERE p.consumer = ingress_position.consumer
                        AND p.stream = ingress_position.stream), 0);
END $$;

-- Moves a consumer's position forward (never backwards). Call it in the
-- transaction that inserts the envelopes read up to that position. Refused (42501)
-- for a consumer another role owns.
CREATE FUNCTION ingress_store_position(consumer text, stream text, new_position bigint)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    moved bigint;
    owner oid;
BEGIN
    IF consumer IS NULL OR stream IS NULL OR new_position IS NULL THEN
        RAISE EXCEPTION 'consumer, stream and position must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF consumer = '' THEN
        RAISE EXCEPTION 'consumer name must not be empty' USING ERRCODE = 'invalid_parameter_value';
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
