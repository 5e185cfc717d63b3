SELECT count(*), sum(pg_catalog.length(r.originator_envelope)), sum(pg_catalog.length(r.topic)), max(r.gateway_time)
  FROM envelopes_xmtpd.select_newest_from_topics(:topics::bytea[]) r;
