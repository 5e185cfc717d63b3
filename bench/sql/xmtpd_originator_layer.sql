-- The same read through the xmtpd layer (envelopes_xmtpd), as xmtpd would call it.
\set node 3
\set after 0
\set lim 1000
SELECT count(*), sum(pg_catalog.length(r.originator_envelope)), sum(pg_catalog.length(r.topic)), max(r.gateway_time)
  FROM envelopes_xmtpd.select_gateway_envelopes_by_single_originator(:node, :after, :lim) r;
