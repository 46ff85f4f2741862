-- The API's bounds on a stored snapshot's content type and headers, as
-- CHECKs, so that a bug in validation cannot store what the API refuses
-- (server/wire/snapshot_validation.h, docs/spec.md#validation, decision 18):
-- a content type of at most 255 bytes without CR or LF; at most 64 headers,
-- each name 1-256 bytes of RFC 9110 token characters, each value a string of
-- at most 8192 bytes without CR or LF. PostgreSQL holds no NUL.

-- One header as validation accepts it. A CHECK cannot hold a subquery, so
-- the whole object is checked by the function after it.
CREATE FUNCTION idempotency_result_header_valid(name text, value jsonb)
  RETURNS boolean LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN octet_length(name) BETWEEN 1 AND 256
  AND name ~ '^[!#$%&''*+.^_`|~0-9A-Za-z-]+$'
  AND jsonb_typeof(value) = 'string'
  AND octet_length(value #>> '{}') <= 8192
  AND (value #>> '{}') !~ '[\r\n]';

CREATE FUNCTION idempotency_result_headers_valid(headers jsonb)
  RETURNS boolean LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN CASE WHEN jsonb_typeof(headers) <> 'object' THEN false
  ELSE (SELECT count(*) <= 64
               AND coalesce(bool_and(
                     idempotency_result_header_valid(h.name, h.value)), true)
          FROM jsonb_each(headers) AS h(name, value))
  END;

-- Older versions accepted any content type and header without NUL. Rows
-- that break the new bounds are repaired rather than left behind a NOT
-- VALID constraint (decision 18): such a content type becomes empty, and
-- the headers keep their valid entries, the first 64 by name.
UPDATE idempotency_record SET result_content_type = ''
  WHERE octet_length(result_content_type) > 255
     OR result_content_type ~ '[\r\n]';
UPDATE idempotency_record SET result_headers = (
    SELECT coalesce(jsonb_object_agg(kept.name, kept.value), '{}'::jsonb)
      FROM (SELECT h.name, h.value
              FROM jsonb_each(result_headers) AS h(name, value)
             WHERE idempotency_result_header_valid(h.name, h.value)
             ORDER BY h.name COLLATE "C"
             LIMIT 64) AS kept)
  WHERE NOT idempotency_result_headers_valid(result_headers);

ALTER TABLE idempotency_record
  ADD CONSTRAINT idempotency_record_content_type_check
    CHECK (octet_length(result_content_type) <= 255
           AND result_content_type !~ '[\r\n]'),
  ADD CONSTRAINT idempotency_record_headers_valid_check
    CHECK (idempotency_result_headers_valid(result_headers));
