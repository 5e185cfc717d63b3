-- One originator from the start, 1,000 rows, through the extension's function.
-- Every form consumes every column xmtpd's query returns, on the server.
\set node 3
\set after 0
\set lim 1000
SELECT count(*), sum(pg_catalog.length(r.originator_envelope)), sum(pg_catalog.length(r.topic)), max(r.gateway_time)
  FROM envelopes.select_originator(:node, :after, :lim) r;
