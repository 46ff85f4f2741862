-- Counting a tenant's open PROCESSING records (--max-processing-per-tenant)
-- reads only that tenant's open records.
CREATE INDEX idempotency_record_processing_tenant_idx
  ON idempotency_record (tenant_id) WHERE status = 'PROCESSING';
