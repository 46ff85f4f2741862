-- pgbench script: what the sidecar sends PostgreSQL for one "fresh" request,
-- statement for statement (server/postgres/postgres_store.cc, prepared there too):
--   Begin on a new key    -> "insert_or_read" (INSERT ... ON CONFLICT DO
--                            NOTHING RETURNING, or else the record it ran
--                            into), which creates the PROCESSING record;
--   Complete with token 1 -> "update" (the guarded UPDATE with its audit
--                            CTE) to SUCCEEDED. The coordinator decides on the
--                            record it holds since Begin granted it
--                            (server/core/held_records.h): no read first.
-- Each statement commits on its own, as the sidecar's nontransactions do.
-- Under concurrency the sidecar folds concurrent requests' statements into
-- batch statements (server/postgres/pg_batch.cc: one round trip and one commit for
-- many); this script is what a service would run on its own, one request at
-- a time per connection.
-- Run with -M prepared; every value the sidecar binds is a parameter here
-- too, except the empty strings (attempt_id, resolved_by, ...), literals ''
-- because pgbench -D cannot define an empty variable. bench/run.sh passes
-- the string values with -D:
--   tenant, operation (fresh keys), hash (32 bytes, '\xabab...'),
--   body (the result snapshot, --snapshot-bytes random bytes, '\x...'),
--   content_type, headers ('{}'), processing ('PROCESSING'),
--   succeeded ('SUCCEEDED'), t ('true'), f ('false').
-- Keys are random 63-bit integers: new on every transaction, like the
-- sidecar's fresh keys (random 64-bit integers). The \set values are the
-- sidecar's defaults: 30 s lease, 24 h retention, 7 d tombstone.
-- bench/run.sh checks before measuring that this script and the sidecar
-- run the same statements per request; if it fails, copy the statements
-- from server/postgres/postgres_store.cc again.
\set key random(0, 9223372036854775806)
\set one 1
\set zero 0
\set minus_one -1
\set code 200
\set lease_us 30000000
\set retention_us 86400000000
\set tombstone_us 604800000000
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
WITH u AS (UPDATE idempotency_record SET
  status = :succeeded, request_hash = :hash, fencing_token = :one,
  attempt = :one, attempt_id = '',
  lease_expires_at = CASE WHEN :minus_one::bigint < 0 THEN lease_expires_at
  ELSE (now() + :minus_one::bigint * interval '1 microsecond') END,
  result_code = CASE WHEN :t::bool THEN :code::integer END,
  result_body = CASE WHEN :t::bool THEN :body::bytea END,
  result_content_type = CASE WHEN :t::bool THEN :content_type::text END,
  result_headers = CASE WHEN :t::bool THEN :headers::jsonb END,
  retryable = :f, updated_at = now(),
  expires_at = CASE WHEN :retention_us::bigint < 0 THEN NULL ELSE
  (now() + :retention_us::bigint * interval '1 microsecond') END,
  resolved_by = '', resolve_reason = '',
  tombstone_retention = :tombstone_us::bigint * interval '1 microsecond',
  reconcile_attempts = 0, next_reconcile_at = NULL
  WHERE tenant_id = :tenant AND operation = :operation
  AND idempotency_key = :key
  AND status = :processing AND fencing_token = :one
  AND (NOT :f::bool OR lease_expires_at <= now())
  RETURNING *),
  a AS (INSERT INTO idempotency_audit (tenant_id, operation,
  idempotency_key, from_status, to_status, actor, reason, fencing_token)
  SELECT tenant_id, operation, idempotency_key, :processing, :processing,
  '', '', :zero FROM u WHERE :f::bool)
  SELECT
  tenant_id, operation, idempotency_key, status, request_hash, fencing_token,
  attempt, attempt_id, (extract(epoch FROM lease_expires_at) * 1000000)::bigint,
  result_code, result_body, result_content_type, result_headers::text,
  retryable, (extract(epoch FROM created_at) * 1000000)::bigint,
  (extract(epoch FROM updated_at) * 1000000)::bigint,
  (extract(epoch FROM expires_at) * 1000000)::bigint, resolved_by,
  resolve_reason, tombstone, waited FROM u;
