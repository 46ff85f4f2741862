-- Begin with `wait`, tombstones and reconciliation of UNKNOWN records.

ALTER TABLE idempotency_record
  -- Past its retention the row keeps identity, request hash, final status
  -- and token (result dropped) until expires_at: Begin answers EXPIRED.
  ADD COLUMN tombstone boolean NOT NULL DEFAULT false,
  -- How long the tombstone outlives the retention (set when terminal).
  ADD COLUMN tombstone_retention interval NOT NULL DEFAULT '0',
  -- Probes of this UNKNOWN record so far, and when the next is due.
  ADD COLUMN reconcile_attempts integer NOT NULL DEFAULT 0,
  ADD COLUMN next_reconcile_at timestamptz;

ALTER TABLE idempotency_record
  DROP CONSTRAINT idempotency_record_result_check,
  ADD CONSTRAINT idempotency_record_result_check
    CHECK (status <> 'SUCCEEDED' OR result_code IS NOT NULL OR tombstone),
  ADD CONSTRAINT idempotency_record_tombstone_check
    CHECK (NOT tombstone OR (status IN ('SUCCEEDED', 'FAILED')
                             AND result_code IS NULL AND result_body IS NULL));

-- The reconcile loop's scan for UNKNOWN records due for a probe.
CREATE INDEX idempotency_record_reconcile_idx
  ON idempotency_record (next_reconcile_at NULLS FIRST)
  WHERE status = 'UNKNOWN';

-- Waiting Begins are woken by NOTIFY when a record settles (any writer:
-- Complete, Fail, Resolve, the reaper), payload "tenant\noperation\nkey".
CREATE FUNCTION idempotency_record_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('idempotency_record',
                    NEW.tenant_id || E'\n' || NEW.operation || E'\n' ||
                    NEW.idempotency_key);
  RETURN NULL;
END
$$;

CREATE TRIGGER idempotency_record_notify
  AFTER UPDATE OF status ON idempotency_record
  FOR EACH ROW
  WHEN (OLD.status IS DISTINCT FROM NEW.status AND NEW.status <> 'PROCESSING')
  EXECUTE FUNCTION idempotency_record_notify();
