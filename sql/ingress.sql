-- Ingress positions: how far each ingress consumer has stored a bus stream. The
-- bridge writes the position in the same transaction as the envelopes it read up to
-- it, so a stored position never covers an envelope whose insert did not commit.

CREATE TABLE ingress_positions (
    consumer   text        PRIMARY KEY CHECK (consumer <> ''),
    stream     text        NOT NULL,
    position   bigint      NOT NULL CHECK (position >= 0),
    updated_at timestamptz NOT NULL DEFAULT pg_catalog.now()
);
COMMENT ON TABLE ingress_positions IS
    'Last bus stream sequence each ingress consumer stored, committed with the envelopes.';

-- The stored position of a consumer on a stream (0 when it has none yet).
CREATE FUNCTION ingress_position(consumer text, stream text)
RETURNS bigint LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT COALESCE((SELECT p.position FROM @extschema@.ingress_positions p
                      WHERE p.consumer = $1 AND p.stream = $2), 0)
$$;

-- Moves a consumer's position forward (never backwards). Call it in the
-- transaction that inserts the envelopes read up to that position.
CREATE FUNCTION ingress_store_position(consumer text, stream text, new_position bigint)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF consumer IS NULL OR consumer = '' OR stream IS NULL OR new_position IS NULL THEN
        RAISE EXCEPTION 'consumer, stream and position must be given' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF new_position < 0 THEN
        RAISE EXCEPTION 'position must not be negative (got %)', new_position USING ERRCODE = 'numeric_value_out_of_range';
    END IF;
    INSERT INTO @extschema@.ingress_positions AS p (consumer, stream, position)
    VALUES ($1, $2, $3)
    ON CONFLICT ON CONSTRAINT ingress_positions_pkey
    DO UPDATE SET stream = EXCLUDED.stream,
                  position = GREATEST(p.position, EXCLUDED.position),
                  updated_at = now();
END $$;
