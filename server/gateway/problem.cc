#include "server/gateway/problem.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

namespace idem::gateway {
namespace {

struct Kind {
  const char* name;
  const char* title;
};

Kind Describe(ProblemKind kind) {
  switch (kind) {
    case ProblemKind::kBadRequest:
      return {"bad-request", "The request is not one the gateway serves"};
    case ProblemKind::kKeyMissing:
      return {"key-missing", "Idempotency-Key is required"};
    case ProblemKind::kKeyInvalid:
      return {"key-invalid", "Idempotency-Key is not valid"};
    case ProblemKind::kKeyReused:
      return {"key-reused",
              "Idempotency-Key was used with a different request"};
    case ProblemKind::kKeyExpired:
      return {"key-expired", "Idempotency-Key was used and its result expired"};
    case ProblemKind::kInProgress:
      return {"request-in-progress",
              "A request with this Idempotency-Key is in progress"};
    case ProblemKind::kOutcomeUnknown:
      return {"outcome-unknown",
              "The outcome of an earlier attempt is unknown"};
    case ProblemKind::kBodyTooLarge:
      return {"body-too-large", "The request body is too large"};
    case ProblemKind::kUpstreamUnavailable:
      return {"upstream-unavailable", "The service could not be reached"};
    case ProblemKind::kUnavailable:
      return {"unavailable", "Idempotency records are unavailable"};
    case ProblemKind::kOverloaded:
      return {"overloaded", "Too many requests"};
    case ProblemKind::kInternal:
      break;
  }
  return {"internal", "Internal error"};
}

}  // namespace

std::string ProblemType(ProblemKind kind) {
  return absl::StrCat("tag:idempotency-sidecar,2026:", Describe(kind).name);
}

std::string ProblemBody(ProblemKind kind, int status, absl::string_view detail,
                        absl::string_view key) {
  nlohmann::ordered_json doc;
  doc["type"] = ProblemType(kind);
  doc["title"] = Describe(kind).title;
  doc["status"] = status;
  doc["detail"] = std::string(detail);
  if (!key.empty()) doc["idempotency_key"] = std::string(key);
  // Keys are visible ASCII, details ours: valid UTF-8; replace rather than
  // throw should that ever change.
  return doc.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace idem::gateway
