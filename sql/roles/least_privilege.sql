-- Least privilege for the sidecar (not a migration: run it once as a
-- superuser, in the sidecar's database, before the first migration).
--
--   idem_migrator  owns the schema objects; used only by
--                  `idempotency-sidecar migrate` (or --migrate).
--   idem_runtime   what serving instances log in as: reads and writes rows,
--                  no DDL, cannot drop or alter anything.
--
-- Set passwords (or use certificate / IAM auth) afterwards, e.g.
--   ALTER ROLE idem_runtime PASSWORD '...';
-- and give each its own DSN: IDEM_POSTGRES for the Deployment, the
-- migrator's DSN only for the migration Job.

CREATE ROLE idem_migrator LOGIN;
CREATE ROLE idem_runtime LOGIN;

-- The migrator creates tables in a schema it owns.
CREATE SCHEMA IF NOT EXISTS idempotency AUTHORIZATION idem_migrator;
ALTER ROLE idem_migrator SET search_path = idempotency;
ALTER ROLE idem_runtime SET search_path = idempotency;

GRANT USAGE ON SCHEMA idempotency TO idem_runtime;
-- Rights on every table the migrator creates, now and in later migrations.
ALTER DEFAULT PRIVILEGES FOR ROLE idem_migrator IN SCHEMA idempotency
  GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO idem_runtime;
ALTER DEFAULT PRIVILEGES FOR ROLE idem_migrator IN SCHEMA idempotency
  GRANT USAGE, SELECT ON SEQUENCES TO idem_runtime;

-- Nobody else gets anything by default.
REVOKE ALL ON SCHEMA idempotency FROM PUBLIC;
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
