// Caller identity and authorization (docs/spec.md#security): principals
// from a bearer token (--auth-tokens FILE) or a verified client certificate's
// subject alternative name, each with a role and the tenants it may act for.
#ifndef IDEM_SERVER_RPC_AUTH_H_
#define IDEM_SERVER_RPC_AUTH_H_

#include <sys/stat.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/base/periodic.h"

namespace idem {

enum class Role {
  kService,   // may call idempotency.v1.Idempotency
  kOperator,  // may also call idempotency.v1.IdempotencyAdmin
};

struct Principal {
  std::string name;
  Role role = Role::kService;
  // Tenants this principal may act for; "*" means every tenant.
  std::vector<std::string> tenants;
};

// The --auth-tokens file:
//   {"principals":   [{"name": "payments", "token": "...",
//                      "tenants": ["tenant-a"], "role": "service"}],
//    "certificates": [{"san": "spiffe://prod/payments", "name": "payments",
//                      "tenants": ["tenant-a"], "role": "service"}]}
struct AuthConfig {
  std::vector<std::pair<std::string, Principal>> tokens;
  std::map<std::string, Principal> certificates;  // by SAN
};

// Parses the file's JSON text. INVALID_ARGUMENT naming the bad field
// ("principals[1].role: ...").
absl::StatusOr<AuthConfig> ParseAuthConfig(const std::string& json);

// Returns OK if `p` may make a call on `tenant` ("" = every tenant) of the
// admin service (`admin`) or the business service; PERMISSION_DENIED
// otherwise.
absl::Status Authorize(const Principal& p, bool admin,
                       const std::string& tenant);

// Compares without an early exit, so timing does not reveal how much of a
// guessed token was right.
bool ConstantTimeEquals(const std::string& a, const std::string& b);

// Identifies callers. Thread-safe. Reloads the tokens file when it changes
// (checked every second); a file that no longer parses is logged and the
// previous principals stay in force.
class Authenticator {
 public:
  // `tokens_path` may be empty (certificates only then come from nowhere:
  // every caller is unauthenticated).
  static absl::StatusOr<std::unique_ptr<Authenticator>> Create(
      const std::string& tokens_path);
  ~Authenticator();
  Authenticator(const Authenticator&) = delete;
  Authenticator& operator=(const Authenticator&) = delete;

  // The principal of a caller that presented `bearer` (the token after
  // "Bearer ", empty if none) and, on a verified TLS connection, the
  // certificate SANs `sans`. UNAUTHENTICATED when neither names a principal.
  absl::StatusOr<Principal> Identify(const std::string& bearer,
                                     const std::vector<std::string>& sans);

  // Re-reads the file now if it changed; returns the parse error, if any
  // (the last good principals then stay). A removed file revokes every
  // principal until it is back.
  absl::Status ReloadIfChanged();

 private:
  explicit Authenticator(std::string path);

  const std::string path_;
  absl::Mutex mu_;
  AuthConfig config_ ABSL_GUARDED_BY(mu_);
  struct stat seen_ ABSL_GUARDED_BY(mu_) = {};
  // The file was removed: config_ is empty until it is back.
  bool revoked_ ABSL_GUARDED_BY(mu_) = false;
  // With a file: ReloadIfChanged every second on the shared timer thread
  // (a stat, and a read and parse of the local file when it changed).
  // Last: stops before the members it uses go.
  std::unique_ptr<PeriodicJob> watcher_;
};

}  // namespace idem

#endif  // IDEM_SERVER_RPC_AUTH_H_
