SELECT count(*), sum(r.max_sequence_id) FROM envelopes_xmtpd.select_originator_ceilings(:nodes::int[]) r;
