-- Every envelope of the store (a scan of the whole view, the case the key lookup
-- costs most in: one probe per row against one join of the two tables).
SELECT count(*), sum(pg_catalog.length(originator_envelope)) FROM @VIEW@;
