-- The envelope store: two partitioned tables and the view that joins them.
--
-- Both tables are partitioned LIST (originator_node_id), and each originator's
-- partition RANGE (originator_sequence_id) in bands. The extension creates those
-- partitions on demand (src/store/partition/); this file creates only the roots.
--
-- There are no foreign keys between meta and blob (or to any payer table): ATTACH
-- PARTITION on a table that takes part in a foreign key locks the referenced parents
-- in SHARE ROW EXCLUSIVE mode, and in-transaction partition creation then deadlocks
-- with concurrent inserts. The insert functions write meta and blob together in one
-- statement instead, and envelopes.orphaned_envelopes() reports any row that lost
-- its twin. There is no DEFAULT partition either: a row without a band would land
-- there and block the later creation of the band that should hold it.
--
-- The roots carry no index. Each originator's partition gets the primary key
-- (originator_node_id, originator_sequence_id) and, for meta, the topic index
-- (topic, originator_sequence_id: within one band the node is constant, so it
-- serves "this topic after this cursor, in order") and the expiry index
-- (prune_expired() finds expired rows without a full scan) when the extension
-- creates it, and ATTACH PARTITION clones them into every band
-- (src/store/partition/catalog.rs, originator_indexes). A key is unique in the
-- store because each originator's rows live in its own partition. Why not on the
-- roots: the roots belong to the extension, so pg_restore creates them (with
-- CREATE EXTENSION) before it attaches the dumped partitions; an index on a root
-- is then cloned into each partition as it is attached, and the dump's own
-- statements creating the same indexes fail ("multiple primary keys for table").
--
-- There are no CHECK constraints (ids >= 0 are checked by the insert functions):
-- Postgres re-reads and compiles a table's CHECK expressions for every INSERT
-- statement, and on this single-row hot path two such checks per table cost about
-- a quarter of the insert (measured: 17.5 -> 12.5 us per row).

CREATE TABLE gateway_envelopes_meta (
    originator_node_id     integer     NOT NULL,
    originator_sequence_id bigint      NOT NULL,
    gateway_time           timestamptz NOT NULL DEFAULT pg_catalog.now(),
    topic                  bytea       NOT NULL,
    payer_id               integer,
    -- Unix seconds after which the row may be pruned; NULL keeps it forever.
    expiry                 bigint,
    -- The inserting transaction, so readers can tell rows that may still be joined by
    -- a lower, not yet committed sequence id (see originator_ceilings()).
    inserted_xid           xid8        NOT NULL DEFAULT pg_catalog.pg_current_xact_id(),
    -- Arrived below a sequence id of its originator that another transaction had
    -- already committed: it is also in late_envelopes, and consumers receive it
    -- from there (src/store/feed/).
    late                   boolean     NOT NULL DEFAULT false
) PARTITION BY LIST (originator_node_id);

COMMENT ON TABLE gateway_envelopes_meta IS
    'Envelope metadata, partitioned by originator then by sequence band. Write through envelopes.insert_gateway_envelope(s).';


CREATE TABLE gateway_envelopes_blob (
    originator_node_id     integer NOT NULL,
    originator_sequence_id bigint  NOT NULL,
    originator_envelope    bytea   NOT NULL
) PARTITION BY LIST (originator_node_id);

COMMENT ON TABLE gateway_envelopes_blob IS
    'Envelope bytes, partitioned like gateway_envelopes_meta. Write through envelopes.insert_gateway_envelope(s).';

-- envelopes.orphaned_envelopes(), the rows present in one table but not the
-- other, is in Rust (src/store/read/orphans.rs): it reads band by band, where an
-- anti-join over the roots locks every band at once.

-- The late-envelope feed: entries for envelopes that arrived below a sequence id
-- of their originator that another transaction had already committed (a consumer
-- may have moved past them). Written by the insert functions in the inserting
-- statement; read by the consumer functions in id order, like the outbox. An
-- entry covers the late rows of one originator that its transaction inserted with
-- sequence ids from originator_sequence_id to last_sequence_id: the meta rows
-- flagged late with that inserted_xid (a transaction records one entry per
-- originator and statement, none overlapping another of its own). Entries from
-- before 0.4.0 have neither and cover their one row. The ids come from a CACHE 1
-- sequence, so they are drawn in increasing order across sessions, which the
-- feed's in-flight markers rely on (src/store/feed/markers.rs); a consumer's
-- late-feed position is an id times 2^24 plus how far into the entry's range it
-- has read, so ids stop at 2^39 - 1.
CREATE TABLE late_envelopes (
    id                     bigint      GENERATED ALWAYS AS IDENTITY (MAXVALUE 549755813887) PRIMARY KEY,
    originator_node_id     integer     NOT NULL,
    originator_sequence_id bigint      NOT NULL,
    recorded_at            timestamptz NOT NULL DEFAULT pg_catalog.now(),
    last_sequence_id       bigint,
    inserted_xid           xid8
);
-- prune_expired() deletes the one-row entries of the envelopes it deletes.
CREATE INDEX late_envelopes_key_idx ON late_envelopes (originator_node_id, originator_sequence_id);
COMMENT ON TABLE late_envelopes IS
    'Envelopes inserted below a sequence id their originator had already committed; consumers read them from here.';

-- pg_dump carries this state (see "Backup, restore and moving hosts" in the docs):
-- a table created by an extension is otherwise left out of every dump.
SELECT pg_catalog.pg_extension_config_dump('@extschema@.late_envelopes', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.late_envelopes_id_seq', '');
