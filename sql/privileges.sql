-- Runs last: nothing of the extension is usable by PUBLIC until granted with the
-- grant_* functions (see sql/roles.sql). New functions are executable by PUBLIC by
-- default, so this matters even though PUBLIC has no USAGE on the schema (a role
-- could be given USAGE for another reason).
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA @extschema@ FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA @extschema@ FROM PUBLIC;
REVOKE ALL ON SCHEMA @extschema@ FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA envelopes_xmtpd FROM PUBLIC;
-- The view's per-row lookup (envelope_of) is no exception: the view runs it as
-- the caller, so grant_reader grants it with the view.
