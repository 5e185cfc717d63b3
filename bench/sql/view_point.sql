-- One envelope by its key.
SELECT * FROM @VIEW@ WHERE originator_node_id = 7 AND originator_sequence_id = 3456;
