-- The highest sequence id of every originator.
SELECT count(*), sum(r.max_sequence_id) FROM envelopes.originator_maxima(:nodes::int[]) r;
