-- Idempotency records and their audit trail (docs/spec.md#storage).
-- Every row-targeted statement filters on tenant_id, so both tables can be
-- distributed by tenant_id (Citus).

CREATE TABLE idempotency_record (
  tenant_id           text        NOT NULL,
  operation           text        NOT NULL,
  idempotency_key     text        NOT NULL,
  status              text        NOT NULL,
  request_hash        bytea       NOT NULL,
  fencing_token       bigint      NOT NULL,
  attempt             integer     NOT NULL,
  -- The acquiring attempt's id: a retried Begin with it regains the grant.
  attempt_id          text        NOT NULL DEFAULT '',
  lease_expires_at    timestamptz NOT NULL,
  -- The result (SUCCEEDED) or error (FAILED) snapshot; NULL when none.
  result_code         integer,
  result_body         bytea,
  result_content_type text,
  result_headers      jsonb,
  retryable           boolean     NOT NULL DEFAULT false,
  created_at          timestamptz NOT NULL DEFAULT now(),
  updated_at          timestamptz NOT NULL DEFAULT now(),
  -- Terminal records only: when the purger may delete them.
  expires_at          timestamptz,
  resolved_by         text        NOT NULL DEFAULT '',
  resolve_reason      text        NOT NULL DEFAULT '',

  CONSTRAINT idempotency_record_identity
    PRIMARY KEY (tenant_id, operation, idempotency_key),
  CONSTRAINT idempotency_record_status_check
    CHECK (status IN ('PROCESSING', 'SUCCEEDED', 'FAILED', 'UNKNOWN')),
  CONSTRAINT idempotency_record_tenant_check
    CHECK (octet_length(tenant_id) BETWEEN 1 AND 128
           AND tenant_id ~ '^[A-Za-z0-9._:-]+$'),
  CONSTRAINT idempotency_record_operation_check
    CHECK (octet_length(operation) BETWEEN 1 AND 128
           AND operation ~ '^[A-Za-z0-9._:-]+$'),
  CONSTRAINT idempotency_record_key_check
    CHECK (octet_length(idempotency_key) BETWEEN 1 AND 255
           AND idempotency_key ~ '^[!-~]+$'),
  CONSTRAINT idempotency_record_hash_check
    CHECK (octet_length(request_hash) BETWEEN 1 AND 64),
  CONSTRAINT idempotency_record_token_check CHECK (fencing_token >= 1),
  CONSTRAINT idempotency_record_attempt_check CHECK (attempt >= 1),
  CONSTRAINT idempotency_record_attempt_id_check
    CHECK (octet_length(attempt_id) <= 128),
  -- A hard ceiling; the configured limit (default 256 KiB) is checked first.
  CONSTRAINT idempotency_record_body_check
    CHECK (octet_length(result_body) <= 64 * 1024 * 1024),
  CONSTRAINT idempotency_record_result_check
    CHECK (status <> 'SUCCEEDED' OR result_code IS NOT NULL),
  -- Terminal records, and only they, expire; PROCESSING and UNKNOWN never do.
  CONSTRAINT idempotency_record_expiry_check
    CHECK ((status IN ('SUCCEEDED', 'FAILED')) = (expires_at IS NOT NULL))
);

-- The reaper's scan for leases that ran out.
CREATE INDEX idempotency_record_lease_idx
  ON idempotency_record (lease_expires_at) WHERE status = 'PROCESSING';
-- The purger's scan for expired terminal records.
CREATE INDEX idempotency_record_expiry_idx
  ON idempotency_record (expires_at) WHERE expires_at IS NOT NULL;
-- Listing by status and age (idemctl list --status UNKNOWN --older-than 10m).
CREATE INDEX idempotency_record_status_idx
  ON idempotency_record (status, updated_at);

-- One row per transition not made by the holder itself: an operator's
-- Resolve, an expiry applied by the reaper or by a Begin/Get, a late report.
CREATE TABLE idempotency_audit (
  id              bigint      GENERATED ALWAYS AS IDENTITY,
  tenant_id       text        NOT NULL,
  operation       text        NOT NULL,
  idempotency_key text        NOT NULL,
  at              timestamptz NOT NULL DEFAULT now(),
  from_status     text        NOT NULL,
  to_status       text        NOT NULL,
  actor           text        NOT NULL,
  reason          text        NOT NULL,
  fencing_token   bigint      NOT NULL,
  CONSTRAINT idempotency_audit_pkey PRIMARY KEY (tenant_id, id)
);

CREATE INDEX idempotency_audit_record_idx
  ON idempotency_audit (tenant_id, operation, idempotency_key, id);
