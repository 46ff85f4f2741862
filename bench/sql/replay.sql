-- pgbench script: what the sidecar WITHOUT Redis sends PostgreSQL for one
-- replay (a Begin on a finished key), statement for statement
-- (server/coordinator.cc, server/postgres_store.cc): it tries "insert" first
-- (most Begins are for new keys), the conflict returns no row, then "read"
-- returns the SUCCEEDED record with its result snapshot.
-- Run with -M prepared and the -D values of fresh.sql, plus
--   operation (the replay pool's: "<idem-bench --operation>-replay") and
--   pool (keys 0..pool-1, created by idem-bench --preload-only with an empty
--   --key-prefix).
-- bench/run.sh checks before measuring that this script and the sidecar
-- run the same statements per replay.
\set key random(0, :pool - 1)
\set one 1
\set lease_us 30000000
INSERT INTO idempotency_record (tenant_id, operation, idempotency_key,
  status, request_hash, fencing_token, attempt, attempt_id,
  lease_expires_at) VALUES (:tenant, :operation, :key, :processing, :hash,
  :one, :one, '', (now() + :lease_us::bigint * interval '1 microsecond'))
  ON CONFLICT (tenant_id, operation, idempotency_key) DO NOTHING RETURNING
  tenant_id, operation, idempotency_key, status, request_hash, fencing_token,
  attempt, attempt_id, (extract(epoch FROM lease_expires_at) * 1000000)::bigint,
  result_code, result_body, result_content_type, result_headers::text,
  retryable, (extract(epoch FROM created_at) * 1000000)::bigint,
  (extract(epoch FROM updated_at) * 1000000)::bigint,
  (extract(epoch FROM expires_at) * 1000000)::bigint, resolved_by,
  resolve_reason, tombstone;
SELECT
  tenant_id, operation, idempotency_key, status, request_hash, fencing_token,
  attempt, attempt_id, (extract(epoch FROM lease_expires_at) * 1000000)::bigint,
  result_code, result_body, result_content_type, result_headers::text,
  retryable, (extract(epoch FROM created_at) * 1000000)::bigint,
  (extract(epoch FROM updated_at) * 1000000)::bigint,
  (extract(epoch FROM expires_at) * 1000000)::bigint, resolved_by,
  resolve_reason, tombstone, (extract(epoch FROM n.now) * 1000000)::bigint
  FROM (SELECT now() AS now) n LEFT JOIN idempotency_record r
  ON r.tenant_id = :tenant AND r.operation = :operation
  AND r.idempotency_key = :key;
