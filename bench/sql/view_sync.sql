-- A replica syncing one originator from a cursor in the middle of its history.
SELECT * FROM @VIEW@
 WHERE originator_node_id = 7 AND originator_sequence_id > 2500
 ORDER BY originator_sequence_id LIMIT 100;
