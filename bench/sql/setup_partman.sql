-- pg_partman as a peer (bench/run.sh runs this after setup.sql where pg_partman
-- is installed, Debian's postgresql-15-partman here): one range-partitioned pair,
-- the same 3 bands made ahead, the same primary key.
CREATE SCHEMA partman;
CREATE EXTENSION pg_partman SCHEMA partman;
CREATE TABLE partman_meta (LIKE envelopes.gateway_envelopes_meta INCLUDING DEFAULTS,
                           PRIMARY KEY (originator_node_id, originator_sequence_id))
    PARTITION BY RANGE (originator_sequence_id);
CREATE TABLE partman_blob (LIKE envelopes.gateway_envelopes_blob INCLUDING DEFAULTS,
                           PRIMARY KEY (originator_node_id, originator_sequence_id))
    PARTITION BY RANGE (originator_sequence_id);
CREATE INDEX ON partman_meta (topic, originator_sequence_id);
SELECT partman.create_parent('public.partman_meta', 'originator_sequence_id', 'native', '10000000',
                             p_premake => 3, p_start_partition => '0');
SELECT partman.create_parent('public.partman_blob', 'originator_sequence_id', 'native', '10000000',
                             p_premake => 3, p_start_partition => '0');
