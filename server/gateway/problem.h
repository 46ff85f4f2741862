// The gateway's error answers: RFC 9457 problem documents with one stable
// `type` per case (docs/gateway.md#problems). Pure.
#ifndef IDEM_SERVER_GATEWAY_PROBLEM_H_
#define IDEM_SERVER_GATEWAY_PROBLEM_H_

#include <string>

#include "absl/strings/string_view.h"

namespace idem::gateway {

enum class ProblemKind {
  kBadRequest,
  kKeyMissing,
  kKeyInvalid,
  kKeyReused,
  kKeyExpired,
  kInProgress,
  kOutcomeUnknown,
  kBodyTooLarge,
  kUpstreamUnavailable,
  kUnavailable,
  kOverloaded,
  kInternal,
};

// "tag:idempotency-sidecar,2026:key-missing", ...
std::string ProblemType(ProblemKind kind);

// The application/problem+json body: type, title, status, detail, and
// idempotency_key when `key` is not empty.
std::string ProblemBody(ProblemKind kind, int status, absl::string_view detail,
                        absl::string_view key = {});

}  // namespace idem::gateway

#endif  // IDEM_SERVER_GATEWAY_PROBLEM_H_
