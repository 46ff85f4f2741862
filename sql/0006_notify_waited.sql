-- A settling record notifies only when a Begin may be waiting on it
-- (docs/decisions/0019-notify-only-waited.md). pg_notify takes a
-- database-wide lock at commit, which serialised every settling commit
-- although almost no record ever has a waiter.

-- Set by a waiting Begin (never cleared): its read marks the record before
-- it parks, under the row lock that a settling UPDATE also takes, so either
-- the settle sees the mark and notifies or the Begin reads the settled row.
ALTER TABLE idempotency_record
  ADD COLUMN waited boolean NOT NULL DEFAULT false;

DROP TRIGGER idempotency_record_notify ON idempotency_record;

CREATE TRIGGER idempotency_record_notify
  AFTER UPDATE OF status ON idempotency_record
  FOR EACH ROW
  WHEN (NEW.waited AND OLD.status IS DISTINCT FROM NEW.status
        AND NEW.status <> 'PROCESSING')
  EXECUTE FUNCTION idempotency_record_notify();
