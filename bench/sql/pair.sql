-- pgbench script: the idempotency pair a service would write by hand on the
-- sidecar's own table (sql/), without the sidecar's extras (no RETURNING,
-- no read of the record it ran into, no audit row):
--   claim    -> INSERT ... ON CONFLICT DO NOTHING of the PROCESSING record;
--   complete -> UPDATE to SUCCEEDED with the result, guarded by status and
--               fencing token.
-- Each statement commits on its own. It measures what PostgreSQL can do for
-- this work on the same table, with its constraints, indexes and trigger
-- (docs/scaling.md): the sidecar's fresh requests are compared with it
-- (fresh_vs_pair). Run with -M prepared and the -D values of fresh.sql.
-- Keys are random 63-bit integers, new on every transaction.
\set key random(0, 9223372036854775806)
INSERT INTO idempotency_record (tenant_id, operation, idempotency_key,
  status, request_hash, fencing_token, attempt, lease_expires_at)
  VALUES (:tenant, :operation, :key, :processing, :hash, 1, 1,
  now() + interval '30 seconds')
  ON CONFLICT (tenant_id, operation, idempotency_key) DO NOTHING;
UPDATE idempotency_record SET status = :succeeded, result_code = 200,
  result_body = :body, result_content_type = :content_type,
  result_headers = :headers, updated_at = now(),
  expires_at = now() + interval '24 hours'
  WHERE tenant_id = :tenant AND operation = :operation
  AND idempotency_key = :key AND status = :processing AND fencing_token = 1;
