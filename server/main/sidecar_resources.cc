#include "server/main/sidecar_resources.h"

#include <fstream>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/rpc/tls.h"

namespace idem {
namespace {

// The keys of the cache's MAC: --redis-mac-key-file or IDEM_REDIS_MAC_KEY
// (required), and --redis-mac-previous-key-file or
// IDEM_REDIS_MAC_PREVIOUS_KEY (optional, while keys rotate).
absl::StatusOr<std::shared_ptr<const CacheMac>> LoadCacheMac(
    const SidecarConfig& c) {
  absl::StatusOr<std::string> current = ReadSecret(
      "redis-mac-key-file", c.redis_mac_key_file, c.redis_mac_key_env);
  if (!current.ok()) return current.status();
  absl::StatusOr<std::string> previous =
      ReadSecret("redis-mac-previous-key-file", c.redis_mac_previous_key_file,
                 c.redis_mac_previous_key_env);
  if (!previous.ok()) return previous.status();
  for (const auto& [flag, key] :
       {std::pair{"redis-mac-key-file", &*current},
        std::pair{"redis-mac-previous-key-file", &*previous}}) {
    if (!key->empty() && key->size() < CacheMac::kMinKeySize) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", flag, ": the key has ", key->size(), " bytes; at least ",
          CacheMac::kMinKeySize, " are needed"));
    }
  }
  absl::StatusOr<std::shared_ptr<const CacheMac>> mac =
      CacheMac::Create(*current, *previous);
  if (!mac.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--redis-mac-previous-key-file: ", mac.status().message()));
  }
  return mac;
}

// The policies and routes of the --config file.
absl::Status LoadConfigFile(const SidecarOptions& options,
                            SidecarResources* out) {
  const std::string& path = options.config.config;
  if (!path.empty()) {
    absl::StatusOr<PolicySet> loaded = LoadPolicies(path);
    if (!loaded.ok()) return loaded.status();
    out->policies = *std::move(loaded);
  }
  if (!options.http) return absl::OkStatus();
  if (!path.empty()) {
    absl::StatusOr<gateway::GatewayConfig> loaded =
        gateway::LoadGatewayConfig(path);
    if (!loaded.ok()) return loaded.status();
    out->routes = *std::move(loaded);
  }
  absl::StatusOr<PolicySet> merged = gateway::WithRoutePolicies(
      out->policies, out->routes, options.http->upstream_timeout);
  if (!merged.ok()) return merged.status();
  out->policies = *std::move(merged);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ReadSecret(const std::string& flag,
                                       const std::string& file,
                                       const std::string& env_value) {
  if (file.empty()) return env_value;
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, "=", file, ": cannot read"));
  }
  std::string secret{std::istreambuf_iterator<char>(in),
                     std::istreambuf_iterator<char>()};
  while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) {
    secret.pop_back();
  }
  if (secret.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, "=", file, ": empty"));
  }
  return secret;
}

absl::StatusOr<SidecarResources> LoadResources(SidecarOptions* options) {
  const SidecarConfig& c = options->config;
  SidecarResources out;
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      ServerCredentialsFor({c.tls.cert, c.tls.key, c.tls_client_ca});
  if (!credentials.ok()) return credentials.status();
  out.credentials = *std::move(credentials);
  if (!c.auth_tokens.empty()) {
    absl::StatusOr<std::unique_ptr<Authenticator>> auth =
        Authenticator::Create(c.auth_tokens);
    if (!auth.ok()) return auth.status();
    out.auth = *std::move(auth);
  }
  if (options->redis) {
    absl::StatusOr<std::string> password = ReadSecret(
        "redis-password-file", c.redis_password_file, c.redis_password_env);
    if (!password.ok()) return password.status();
    options->redis->password = *std::move(password);
    absl::StatusOr<std::shared_ptr<const CacheMac>> mac = LoadCacheMac(c);
    if (!mac.ok()) return mac.status();
    out.cache_mac = *std::move(mac);
  }
  absl::Status s = LoadConfigFile(*options, &out);
  if (!s.ok()) return s;
  return out;
}

}  // namespace idem
