-- The SQL surface of pg_envelopes: what CREATE EXTENSION installs.
-- This golden file is the contract; a change here is a change users see.

SELECT n.nspname AS schema, e.extrelocatable AS relocatable
  FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
 WHERE e.extname = 'pg_envelopes';

-- Functions, with their full signatures.
SELECT p.proname,
       pg_get_function_arguments(p.oid) AS arguments,
       pg_get_function_result(p.oid) AS result,
       p.provolatile AS volatility,
       p.proisstrict AS strict,
       p.prosecdef AS security_definer,
       p.proconfig AS settings,
       p.proacl AS privileges
  FROM pg_proc p
 WHERE p.pronamespace = 'envelopes'::regnamespace
 ORDER BY 1, 2;

-- Tables, views and their columns.
SELECT c.relname, c.relkind, a.attnum, a.attname,
       format_type(a.atttypid, a.atttypmod) AS type, a.attnotnull AS not_null,
       pg_get_expr(d.adbin, d.adrelid) AS default
  FROM pg_class c
  JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
  LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
 WHERE c.relnamespace = 'envelopes'::regnamespace AND c.relkind IN ('p', 'r', 'v')
 ORDER BY c.relname, a.attnum;

-- Partitioning keys.
SELECT c.relname, pg_get_partkeydef(c.oid) AS partition_key
  FROM pg_class c
 WHERE c.relnamespace = 'envelopes'::regnamespace AND c.relkind = 'p'
 ORDER BY 1;

-- Indexes and constraints on the roots; no foreign keys anywhere.
SELECT indexrelid::regclass AS index, pg_get_indexdef(indexrelid) AS definition
  FROM pg_index
 WHERE indrelid IN ('envelopes.gateway_envelopes_meta'::regclass, 'envelopes.gateway_envelopes_blob'::regclass)
 ORDER BY 1;
SELECT conrelid::regclass AS "table", conname, contype, pg_get_constraintdef(oid) AS definition
  FROM pg_constraint
 WHERE connamespace = 'envelopes'::regnamespace
   AND contype <> 'n' -- NOT NULL as a constraint: Postgres 18 lists those here too
 ORDER BY 1, 2;

-- Settings, with their defaults (registered when the library loads).
LOAD 'pg_envelopes';
SELECT name, setting, unit, context, short_desc
  FROM pg_settings WHERE name LIKE 'envelopes.%' ORDER BY 1;
