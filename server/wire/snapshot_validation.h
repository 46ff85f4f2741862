// The checks every snapshot from outside the sidecar passes before it is
// stored (docs/spec.md#validation): a Complete's result, a Fail's error, an
// operator's Resolve, and a reconciler probe's APPLIED answer alike. Pure,
// over the protobuf message only, so that every layer can use them.
#ifndef IDEM_SERVER_WIRE_SNAPSHOT_VALIDATION_H_
#define IDEM_SERVER_WIRE_SNAPSHOT_VALIDATION_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "idempotency/v1/idempotency.pb.h"

namespace idem {

// The longest reason and actor of an audited transition, in bytes, as in
// the SQL CHECKs on the record and its audit rows (sql/0004_text_bounds.sql).
inline constexpr size_t kMaxReasonBytes = 1024;
inline constexpr size_t kMaxActorBytes = 128;

// A snapshot's content type and headers are replayed as HTTP header fields
// (decision 18); these bounds are also the SQL CHECKs of
// sql/0005_snapshot_header_bounds.sql.
inline constexpr size_t kMaxContentTypeBytes = 255;
inline constexpr size_t kMaxHeaders = 64;
inline constexpr size_t kMaxHeaderNameBytes = 256;
inline constexpr size_t kMaxHeaderValueBytes = 8192;

// OK, or INVALID_ARGUMENT naming `field` (e.g. "result.headers"): a content
// type of at most kMaxContentTypeBytes without CR, LF or NUL; at most
// kMaxHeaders headers, each name 1-kMaxHeaderNameBytes bytes of RFC 9110
// token characters, each value at most kMaxHeaderValueBytes without CR, LF
// or NUL; and at most `max_bytes` of body, content type and headers
// together. protobuf's parser has refused invalid UTF-8 in the string
// fields already.
absl::Status CheckSnapshot(const ::idempotency::v1::Snapshot& snapshot,
                           const std::string& field, size_t max_bytes);

// The audit reason of a probe's settling verdict ("applied" or
// "not_applied"): "reconciler: probe said <verdict>: <detail>", the detail
// cut at a UTF-8 boundary to stay within kMaxReasonBytes. The reconciler
// and `idemctl reconcile --dry-run` still refuse it, with CheckText, when
// the part kept holds NUL.
std::string ProbeReason(const std::string& verdict, const std::string& detail);

// Whether `name` may be a record's tenant or operation: 1-128 bytes of
// [A-Za-z0-9._:-].
bool IsRecordName(const std::string& name);

// Free text stored as PostgreSQL text: OK, or INVALID_ARGUMENT naming
// `field` when it is longer than `max` bytes, holds NUL, or is empty though
// `required`.
absl::Status CheckText(const std::string& value, const std::string& field,
                       size_t max, bool required);

}  // namespace idem

#endif  // IDEM_SERVER_WIRE_SNAPSHOT_VALIDATION_H_
