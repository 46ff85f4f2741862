#include "server/rpc/auth.h"

#include <cerrno>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "server/base/log.h"

namespace idem {
namespace {

absl::Status Bad(const std::string& field, const std::string& why) {
  return absl::InvalidArgumentError(
      absl::StrCat("auth tokens ", field, ": ", why));
}

absl::StatusOr<Principal> ParsePrincipal(const nlohmann::json& j,
                                         const std::string& path) {
  if (!j.is_object()) return Bad(path, "must be an object");
  Principal p;
  if (!j.contains("name") || !j["name"].is_string() ||
      j["name"].get<std::string>().empty()) {
    return Bad(path + ".name", "required string");
  }
  p.name = j["name"].get<std::string>();
  // Compared as JSON values, so a role that is not a string (null, 1) is
  // refused like a misspelt one instead of throwing.
  const auto role = j.find("role");
  if (role == j.end() || *role == "service") {
    p.role = Role::kService;
  } else if (*role == "operator") {
    p.role = Role::kOperator;
  } else {
    return Bad(path + ".role", "must be \"service\" or \"operator\"");
  }
  if (!j.contains("tenants") || !j["tenants"].is_array() ||
      j["tenants"].empty()) {
    return Bad(path + ".tenants", "required non-empty list (\"*\" = all)");
  }
  for (const auto& t : j["tenants"]) {
    if (!t.is_string() || t.get<std::string>().empty()) {
      return Bad(path + ".tenants", "must hold non-empty strings");
    }
    p.tenants.push_back(t.get<std::string>());
  }
  for (const auto& [k, v] : j.items()) {
    if (k != "name" && k != "role" && k != "tenants" && k != "token" &&
        k != "san") {
      return Bad(absl::StrCat(path, ".", k), "unknown field");
    }
  }
  return p;
}

absl::StatusOr<std::string> ReadAll(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError("cannot read " + path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::StatusOr<AuthConfig> ParseRoot(const nlohmann::json& root) {
  AuthConfig config;
  for (const auto& [k, v] : root.items()) {
    if (k != "principals" && k != "certificates") {
      return Bad(k, "unknown field (known: principals, certificates)");
    }
    if (!v.is_array()) return Bad(k, "must be a list");
  }
  if (root.contains("principals")) {
    int i = 0;
    for (const auto& j : root["principals"]) {
      const std::string path = absl::StrCat("principals[", i++, "]");
      absl::StatusOr<Principal> p = ParsePrincipal(j, path);
      if (!p.ok()) return p.status();
      if (!j.contains("token") || !j["token"].is_string() ||
          j["token"].get<std::string>().size() < 16) {
        return Bad(path + ".token", "required string of at least 16 bytes");
      }
      for (const auto& [token, other] : config.tokens) {
        if (token == j["token"].get<std::string>()) {
          return Bad(path + ".token", "also used by " + other.name);
        }
      }
      config.tokens.emplace_back(j["token"].get<std::string>(), *p);
    }
  }
  if (root.contains("certificates")) {
    int i = 0;
    for (const auto& j : root["certificates"]) {
      const std::string path = absl::StrCat("certificates[", i++, "]");
      absl::StatusOr<Principal> p = ParsePrincipal(j, path);
      if (!p.ok()) return p.status();
      if (!j.contains("san") || !j["san"].is_string() ||
          j["san"].get<std::string>().empty()) {
        return Bad(path + ".san", "required string");
      }
      config.certificates[j["san"].get<std::string>()] = *p;
    }
  }
  return config;
}

}  // namespace

absl::StatusOr<AuthConfig> ParseAuthConfig(const std::string& json) {
  const nlohmann::json root = nlohmann::json::parse(json, nullptr, false);
  if (root.is_discarded() || !root.is_object()) {
    return Bad("(top level)", "not a JSON object");
  }
  // Every field's type is checked before it is read; this is the backstop
  // that keeps a check missed from throwing out of the reload thread.
  try {
    return ParseRoot(root);
  } catch (const nlohmann::json::exception& e) {
    return Bad("(top level)", e.what());
  }
}

absl::Status Authorize(const Principal& p, bool admin,
                       const std::string& tenant) {
  if (admin && p.role != Role::kOperator) {
    return absl::PermissionDeniedError(
        absl::StrCat("principal ", p.name, " is not an operator"));
  }
  for (const std::string& t : p.tenants) {
    if (t == "*" || (!tenant.empty() && t == tenant)) return absl::OkStatus();
  }
  return absl::PermissionDeniedError(
      tenant.empty()
          ? absl::StrCat("principal ", p.name, " may not act for all tenants")
          : absl::StrCat("principal ", p.name, " may not act for tenant ",
                         tenant));
}

bool ConstantTimeEquals(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = b.size();
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? a[i] : 0;
    diff |= static_cast<unsigned char>(x ^ static_cast<unsigned char>(b[i]));
  }
  return diff == 0;
}

Authenticator::Authenticator(std::string path) : path_(std::move(path)) {}

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::Create(
    const std::string& tokens_path) {
  auto auth = std::unique_ptr<Authenticator>(new Authenticator(tokens_path));
  if (!tokens_path.empty()) {
    // A file missing at start-up is a mistake, not a revocation.
    struct stat st = {};
    if (stat(tokens_path.c_str(), &st) != 0) {
      return absl::InvalidArgumentError("auth tokens: cannot stat " +
                                        tokens_path);
    }
    absl::Status s = auth->ReloadIfChanged();
    if (!s.ok()) return s;
    Authenticator* raw = auth.get();
    auth->watcher_ = std::make_unique<PeriodicJob>(absl::Seconds(1), [raw] {
      absl::Status s = raw->ReloadIfChanged();
      if (!s.ok()) {
        Log(LogLevel::kError, "auth tokens file not reloaded",
            {{"error", std::string(s.message())}});
      }
    });
  }
  return auth;
}

Authenticator::~Authenticator() = default;

absl::Status Authenticator::ReloadIfChanged() {
  struct stat now = {};
  if (stat(path_.c_str(), &now) != 0) {
    if (errno != ENOENT) {
      return absl::InvalidArgumentError("auth tokens: cannot stat " + path_);
    }
    // Removing the file revokes every principal: it is how an operator
    // shuts callers out at once, and a file that is gone cannot vouch for
    // anyone. Logged once, not at every poll.
    absl::MutexLock lock(&mu_);
    if (revoked_) return absl::OkStatus();
    config_ = AuthConfig{};
    seen_ = {};
    revoked_ = true;
    Log(LogLevel::kWarn,
        "auth tokens file removed: every principal revoked until it is back",
        {{"path", path_}});
    return absl::OkStatus();
  }
  {
    absl::MutexLock lock(&mu_);
    if (now.st_mtim.tv_sec == seen_.st_mtim.tv_sec &&
        now.st_mtim.tv_nsec == seen_.st_mtim.tv_nsec &&
        now.st_size == seen_.st_size && now.st_ino == seen_.st_ino) {
      return absl::OkStatus();
    }
  }
  absl::StatusOr<std::string> text = ReadAll(path_);
  if (!text.ok()) return text.status();
  absl::StatusOr<AuthConfig> config = ParseAuthConfig(*text);
  absl::MutexLock lock(&mu_);
  seen_ = now;
  if (!config.ok()) return config.status();
  config_ = *std::move(config);
  revoked_ = false;
  Log(LogLevel::kInfo, "auth tokens loaded",
      {{"principals", absl::StrCat(config_.tokens.size())},
       {"certificates", absl::StrCat(config_.certificates.size())}});
  return absl::OkStatus();
}

absl::StatusOr<Principal> Authenticator::Identify(
    const std::string& bearer, const std::vector<std::string>& sans) {
  absl::MutexLock lock(&mu_);
  if (!bearer.empty()) {
    const Principal* found = nullptr;
    // Every token is compared, found or not.
    for (const auto& [token, principal] : config_.tokens) {
      if (ConstantTimeEquals(bearer, token)) found = &principal;
    }
    if (found != nullptr) return *found;
    return absl::UnauthenticatedError("unknown bearer token");
  }
  for (const std::string& san : sans) {
    auto it = config_.certificates.find(san);
    if (it != config_.certificates.end()) return it->second;
  }
  return absl::UnauthenticatedError(
      sans.empty() ? "no bearer token or client certificate"
                   : "client certificate names no known principal");
}

}  // namespace idem
