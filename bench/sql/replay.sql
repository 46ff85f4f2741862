-- pgbench script: what the sidecar WITHOUT Redis sends PostgreSQL for one
-- replay (a Begin on a finished key), statement for statement
-- (server/coordinator.cc, server/postgres_store.cc): "insert_or_read" tries
-- the insert (most Begins are for new keys); it conflicts, and the same
-- statement returns the SUCCEEDED record with its result snapshot. Under
-- concurrency the sidecar folds these into insert_or_read_batch statements
-- (server/pg_batch.cc); this script is what a service would run on its own.
-- Run with -M prepared and the -D values of fresh.sql, plus
--   operation (the replay pool's: "<idem-bench --operation>-replay") and
--   pool (keys 0..pool-1, created by idem-bench --preload-only with an empty
--   --key-prefix).
-- bench/run.sh checks before measuring that this script and the sidecar
-- run the same statements per replay.
\set key random(0, :pool - 1)
\set one 1
\set lease_us 30000000
WITH ins AS (INSERT INTO idempotency_record (tenant_id, operation,
  idempotency_key, status, request_hash, fencing_token, attempt, attempt_id,
  lease_expires_at) VALUES (:tenant, :operation, :key, :processing, :hash,
  :one, :one, '', (now() + :lease_us::bigint * interval '1 microsecond'))
  ON CONFLICT (tenant_id, operation, idempotency_key) DO NOTHING
  RETURNING *)
  SELECT x.*, (extract(epoch FROM now()) * 1000000)::bigint
  FROM (SELECT 1) n LEFT JOIN (SELECT
  tenant_id, operation, idempotency_key, status, request_hash, fencing_token,
  attempt, attempt_id, (extract(epoch FROM lease_expires_at) * 1000000)::bigint,
  result_code, result_body, result_content_type, result_headers::text,
  retryable, (extract(epoch FROM created_at) * 1000000)::bigint,
  (extract(epoch FROM updated_at) * 1000000)::bigint,
  (extract(epoch FROM expires_at) * 1000000)::bigint, resolved_by,
  resolve_reason, tombstone, true FROM ins UNION ALL SELECT
  tenant_id, operation, idempotency_key, status, request_hash, fencing_token,
  attempt, attempt_id, (extract(epoch FROM lease_expires_at) * 1000000)::bigint,
  result_code, result_body, result_content_type, result_headers::text,
  retryable, (extract(epoch FROM created_at) * 1000000)::bigint,
  (extract(epoch FROM updated_at) * 1000000)::bigint,
  (extract(epoch FROM expires_at) * 1000000)::bigint, resolved_by,
  resolve_reason, tombstone, false FROM idempotency_record
  WHERE tenant_id = :tenant AND operation = :operation
  AND idempotency_key = :key) x ON true;
