// What the sidecar reads from files before it starts, as its flags name
// them: certificates, the tokens file, Redis secrets, the --config file.
#ifndef IDEM_SERVER_MAIN_SIDECAR_RESOURCES_H_
#define IDEM_SERVER_MAIN_SIDECAR_RESOURCES_H_

#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/base/config.h"
#include "server/cache/redis_codec.h"
#include "server/gateway/gateway_config.h"
#include "server/main/config_validation.h"
#include "server/rpc/auth.h"

namespace idem {

struct SidecarResources {
  std::shared_ptr<grpc::ServerCredentials> credentials;
  // Null without --auth-tokens.
  std::unique_ptr<Authenticator> auth;
  // The keys of the Redis cache's MAC; null without --redis.
  std::shared_ptr<const CacheMac> cache_mac;
  // From --config, with the policies of the gateway's routes merged in.
  PolicySet policies;
  // The gateway's routes, with --http-listen and --config.
  gateway::GatewayConfig routes;
};

// A secret from the file named by --`flag` (trailing newlines ignored), or
// else `env_value`. INVALID_ARGUMENT naming the flag when the file cannot
// be read or is empty.
absl::StatusOr<std::string> ReadSecret(const std::string& flag,
                                       const std::string& file,
                                       const std::string& env_value);

// Reads the files `options` names and sets options->redis->password.
// INVALID_ARGUMENT naming the flag or the file on the first that cannot be
// read or breaks a rule (a MAC key shorter than CacheMac::kMinKeySize).
absl::StatusOr<SidecarResources> LoadResources(SidecarOptions* options);

}  // namespace idem

#endif  // IDEM_SERVER_MAIN_SIDECAR_RESOURCES_H_
