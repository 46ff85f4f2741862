-- pgbench script: what the sidecar WITHOUT Redis sends PostgreSQL for one
-- replay (a Begin on a finished key), statement for statement
-- (server/core/coordinator.cc, server/postgres/postgres_store.cc): while most Begins find
-- their record, as in a stream of replays, the store reads before it
-- inserts (BeginMix, server/postgres/pg_batch.h), so a replay is one "read" that
-- returns the SUCCEEDED record with its result snapshot. (A Begin on a new
-- key then reads, misses and runs "insert_or_read"; once new keys dominate
-- the store goes back to inserting first.) Under concurrency the sidecar
-- folds these reads into read_batch statements (server/postgres/pg_batch.cc); this
-- script is what a service would run on its own.
-- Run with -M prepared and the -D values of fresh.sql, plus
--   operation (the replay pool's: "<idem-bench --operation>-replay") and
--   pool (keys 0..pool-1, created by idem-bench --preload-only with an empty
--   --key-prefix).
-- bench/run.sh checks before measuring that this script and the sidecar
-- run the same statements per replay.
\set key random(0, :pool - 1)
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
