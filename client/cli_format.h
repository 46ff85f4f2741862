// Pure helpers of the idemctl CLI: parsing flag values, rendering records and
// audit entries for people and as JSON, and mapping gRPC codes to exit codes.
// No I/O; every function is thread-safe.
#ifndef IDEM_CLIENT_CLI_FORMAT_H_
#define IDEM_CLIENT_CLI_FORMAT_H_

#include <grpcpp/support/status.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "google/protobuf/message.h"
#include "google/protobuf/repeated_ptr_field.h"
#include "google/protobuf/timestamp.pb.h"
#include "idempotency/v1/idempotency.pb.h"

namespace idem::cli {

namespace pb = ::idempotency::v1;

// Exit codes of idemctl and idem-quickstart (docs/spec.md#idemctl).
inline constexpr int kExitOk = 0;
inline constexpr int kExitRefused = 1;  // not found, or refused by state
inline constexpr int kExitUsage = 2;
inline constexpr int kExitUnavailable = 3;

// Returns the exit code for an RPC that ended with `code`: 0 for OK; 1 for
// NOT_FOUND, FAILED_PRECONDITION, ALREADY_EXISTS and ABORTED; 2 for
// INVALID_ARGUMENT; 3 for everything else (UNAVAILABLE, DEADLINE_EXCEEDED...).
int ExitCodeFor(grpc::StatusCode code);

// Returns the canonical name of `code`, e.g. "NOT_FOUND".
std::string CodeName(grpc::StatusCode code);

// Returns "PROCESSING", "SUCCEEDED", "FAILED", "UNKNOWN", or "-" for
// STATUS_UNSPECIFIED and values this client does not know.
std::string StatusName(pb::Status status);

// Parses "unknown", "UNKNOWN" or "STATUS_UNKNOWN" (any case) and the other
// statuses; INVALID_ARGUMENT for anything else, including "unspecified".
absl::StatusOr<pb::Status> ParseStatus(absl::string_view text);

// Parses a positive duration such as "30s", "10m", "1h30m" or "500ms";
// INVALID_ARGUMENT if it is malformed, zero or negative.
absl::StatusOr<absl::Duration> ParseCliDuration(absl::string_view text);

// Returns true iff `bytes` is valid UTF-8 without control characters other
// than tab, newline and carriage return.
bool IsPrintableUtf8(absl::string_view bytes);

// Returns `body` itself if it is printable UTF-8, else
// "<N bytes, base64: ...>"; "<empty>" for an empty body.
std::string FormatBody(absl::string_view body);

// Returns "-" when `has` is false, else the UTC time with milliseconds and
// its distance from `now`, e.g. "2024-05-01T10:00:00.000Z (3m12s ago)".
std::string FormatTimestamp(bool has, const google::protobuf::Timestamp& ts,
                            absl::Time now);

// Returns a labelled multi-line block with every field of `record`.
std::string FormatRecord(const pb::Record& record, absl::Time now);

// Returns "tenant/operation/key".
std::string FormatKey(const pb::RecordKey& key);

// Returns a table of `records`, one row each, with a header line; "" when
// there are none.
std::string FormatRecordTable(
    const google::protobuf::RepeatedPtrField<pb::Record>& records,
    absl::Time now);

// Returns a table of audit `entries`, oldest first as given, with a header.
std::string FormatHistory(const pb::HistoryResponse& history);

// Returns `rows` (the first one being the header) as left-aligned columns
// separated by two spaces, each line ending in '\n'.
std::string FormatTable(const std::vector<std::vector<std::string>>& rows);

// Returns `message` as one line of proto3 JSON with the .proto field names and
// every field present (defaults included), or an error if it cannot be
// printed.
absl::StatusOr<std::string> ToJson(const google::protobuf::Message& message);

// Returns OK iff `text` is one well-formed JSON value.
absl::Status ValidateJson(absl::string_view text);

}  // namespace idem::cli

#endif  // IDEM_CLIENT_CLI_FORMAT_H_
