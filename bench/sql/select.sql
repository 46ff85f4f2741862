-- pgbench script: the read a service would write by hand to replay a
-- finished request on its own: one SELECT of the stored answer by primary
-- key, with no clock and nothing else. bench/run.sh runs it against the
-- sidecar's replay-pg (ratio replay_pg_vs_select).
-- Run with -M prepared and the -D values of replay.sql.
\set key random(0, :pool - 1)
SELECT status, request_hash, result_code, result_body, result_content_type,
  result_headers
  FROM idempotency_record
  WHERE tenant_id = :tenant AND operation = :operation
  AND idempotency_key = :key;
