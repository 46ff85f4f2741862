-- The API's bounds on the remaining text columns, as CHECKs, so that a bug
-- in validation cannot store what the API refuses (docs/spec.md#storage):
-- Resolve's reason (1-1024 bytes) and actor (at most 128), the audit rows
-- that copy them, and the result headers' shape (an object of strings).
-- PostgreSQL text and jsonb cannot hold NUL, so no CHECK is needed for it.

-- Older versions could store a longer reconciler reason (it quoted the
-- probe's detail whole): shorten those first. 256 characters are at most
-- 1024 bytes of UTF-8.
UPDATE idempotency_record SET resolve_reason = left(resolve_reason, 256)
  WHERE octet_length(resolve_reason) > 1024;
UPDATE idempotency_audit SET reason = left(reason, 256)
  WHERE octet_length(reason) > 1024;

ALTER TABLE idempotency_record
  ADD CONSTRAINT idempotency_record_resolve_reason_check
    CHECK (octet_length(resolve_reason) <= 1024),
  ADD CONSTRAINT idempotency_record_resolved_by_check
    CHECK (octet_length(resolved_by) <= 128),
  ADD CONSTRAINT idempotency_record_headers_check
    CHECK (result_headers IS NULL OR jsonb_typeof(result_headers) = 'object');

ALTER TABLE idempotency_audit
  ADD CONSTRAINT idempotency_audit_actor_check
    CHECK (octet_length(actor) BETWEEN 1 AND 128),
  ADD CONSTRAINT idempotency_audit_reason_check
    CHECK (octet_length(reason) <= 1024);
