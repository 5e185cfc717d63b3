-- The newest envelopes of one topic across every originator.
SELECT * FROM @VIEW@
 WHERE topic = '\x00000005'
 ORDER BY originator_sequence_id DESC LIMIT 50;
