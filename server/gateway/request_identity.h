// What identifies a request to the gateway's records (docs/gateway.md): the
// key from its Idempotency-Key field, scoped by the caller's headers, and the
// fingerprint that tells a retry from another request under the same key.
// Pure.
#ifndef IDEM_SERVER_GATEWAY_REQUEST_IDENTITY_H_
#define IDEM_SERVER_GATEWAY_REQUEST_IDENTITY_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace idem::gateway {

// The longest key a client may send, so that the scoped key stays within
// the 255 bytes of a record key.
inline constexpr size_t kMaxIdempotencyKeyBytes = 200;

// The key in an Idempotency-Key field value: an sf-string (RFC 8941 section
// 3.3.3: "..." with \" and \\ escapes) or, as lenient clients send it, the
// bare value; surrounding spaces and tabs are ignored. The key must be 1 to
// kMaxIdempotencyKeyBytes of visible ASCII. Otherwise INVALID_ARGUMENT
// saying what is wrong.
absl::StatusOr<std::string> ParseIdempotencyKey(absl::string_view value);

// The record key of `key` for a caller whose scope header values are
// `scope` (in the configured order; an absent header is ""): `key` itself
// when there are none, else "<22 base64url chars of their SHA-256>:<key>".
std::string ScopedKey(const std::vector<std::string>& scope,
                      absl::string_view key);

// The request hash of a record: 64 hex digits of the SHA-256 over the
// method, the target (path and query), the SHA-256 of the body, and each
// (name, value) of `headers`, every part length-prefixed.
std::string Fingerprint(
    absl::string_view method, absl::string_view target, absl::string_view body,
    const std::vector<std::pair<std::string, std::string>>& headers);

}  // namespace idem::gateway

#endif  // IDEM_SERVER_GATEWAY_REQUEST_IDENTITY_H_
