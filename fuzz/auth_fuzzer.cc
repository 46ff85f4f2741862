// The --auth-tokens JSON file (server/rpc/auth.h).
//
// Input: the file's text; an input starting with a NUL byte is instead
// split into two strings for ConstantTimeEquals. Properties:
//   - ParseAuthConfig never crashes or throws, whatever the text;
//   - a refusal is INVALID_ARGUMENT starting with "auth tokens ";
//   - an accepted config has principals with a name, a role and non-empty
//     tenants; tokens of at least 16 bytes, all different; certificates
//     with a SAN; and Authorize follows the role and the tenants;
//   - ConstantTimeEquals(a, b) == (a == b).
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "fuzz/fuzz_check.h"
#include "server/rpc/auth.h"

namespace idem {
namespace {

void CheckPrincipal(const Principal& p, const std::string& where) {
  IDEM_FUZZ_CHECK(!p.name.empty(), where + ": no name");
  IDEM_FUZZ_CHECK(!p.tenants.empty(), where + ": no tenants");
  bool all = false;
  for (const std::string& t : p.tenants) {
    IDEM_FUZZ_CHECK(!t.empty(), where + ": an empty tenant");
    all = all || t == "*";
    IDEM_FUZZ_CHECK(Authorize(p, /*admin=*/false, t).ok(),
                    where + ": refused for its own tenant " + t);
  }
  IDEM_FUZZ_CHECK(Authorize(p, /*admin=*/false, "").ok() == all,
                  where +
                      ": all tenants allowed without \"*\", or refused "
                      "with it");
  IDEM_FUZZ_CHECK(Authorize(p, /*admin=*/true, p.tenants[0]).ok() ==
                      (p.role == Role::kOperator),
                  where + ": admin calls do not follow the role");
}

}  // namespace
}  // namespace idem

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace idem;  // NOLINT(build/namespaces)
  if (size > 0 && data[0] == 0) {
    const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
    const size_t half = rest.size() / 2;
    const std::string a = rest.substr(0, half);
    const std::string b = rest.substr(half);
    IDEM_FUZZ_CHECK(ConstantTimeEquals(a, b) == (a == b), "ConstantTimeEquals");
    IDEM_FUZZ_CHECK(ConstantTimeEquals(b, a) == (a == b), "ConstantTimeEquals");
    IDEM_FUZZ_CHECK(ConstantTimeEquals(a, a), "ConstantTimeEquals");
    return 0;
  }
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<AuthConfig> config = ParseAuthConfig(text);
  if (!config.ok()) {
    IDEM_FUZZ_CHECK(
        config.status().code() == absl::StatusCode::kInvalidArgument &&
            config.status().message().rfind("auth tokens ", 0) == 0,
        "refused with " + config.status().ToString());
    return 0;
  }
  std::set<std::string> tokens;
  for (const auto& [token, principal] : config->tokens) {
    IDEM_FUZZ_CHECK(token.size() >= 16, "a short token accepted");
    IDEM_FUZZ_CHECK(tokens.insert(token).second, "a token used twice");
    CheckPrincipal(principal, "principal " + principal.name);
  }
  for (const auto& [san, principal] : config->certificates) {
    IDEM_FUZZ_CHECK(!san.empty(), "a certificate without a SAN");
    CheckPrincipal(principal, "certificate " + san);
  }
  return 0;
}
