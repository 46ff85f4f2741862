#include "server/gateway/request_identity.h"

#include <openssl/evp.h>
#include <openssl/opensslv.h>

#include <array>
#include <memory>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace idem::gateway {
namespace {

using Digest = std::array<unsigned char, 32>;

struct MdCtxFree {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};

// SHA-256, fetched once: OpenSSL 3 otherwise looks the algorithm up in
// its provider tables at every EVP_DigestInit_ex.
const EVP_MD* Sha256Md() {
#if OPENSSL_VERSION_NUMBER >= 0x30000000L
  static const EVP_MD* const md = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  return md != nullptr ? md : EVP_sha256();
#else
  return EVP_sha256();
#endif
}

// SHA-256 over `parts`, each preceded by its length (8 bytes, big-endian),
// so that no two different lists of parts hash alike. Each thread reuses
// one context.
Digest Sha256(const std::vector<absl::string_view>& parts) {
  thread_local const std::unique_ptr<EVP_MD_CTX, MdCtxFree> ctx(
      EVP_MD_CTX_new());
  Digest out{};
  unsigned int size = 0;
  // Failures here mean no memory or no SHA-256 in libcrypto; they cannot
  // be answered better than by stopping.
  if (ctx == nullptr ||
      EVP_DigestInit_ex(ctx.get(), Sha256Md(), nullptr) != 1) {
    abort();
  }
  for (absl::string_view part : parts) {
    unsigned char length[8];
    for (int i = 0; i < 8; ++i) {
      length[i] = static_cast<unsigned char>(
          static_cast<uint64_t>(part.size()) >> (56 - 8 * i));
    }
    if (EVP_DigestUpdate(ctx.get(), length, sizeof length) != 1 ||
        EVP_DigestUpdate(ctx.get(), part.data(), part.size()) != 1) {
      abort();
    }
  }
  if (EVP_DigestFinal_ex(ctx.get(), out.data(), &size) != 1) abort();
  return out;
}

absl::string_view View(const Digest& d) {
  return absl::string_view(reinterpret_cast<const char*>(d.data()), d.size());
}

bool Visible(char c) { return c > 0x20 && c < 0x7f; }

absl::Status Invalid(absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("Idempotency-Key: ", why));
}

}  // namespace

absl::StatusOr<std::string> ParseIdempotencyKey(absl::string_view value) {
  while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) {
    value.remove_prefix(1);
  }
  while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) {
    value.remove_suffix(1);
  }
  std::string key;
  if (!value.empty() && value.front() == '"') {
    size_t i = 1;
    for (; i < value.size() && value[i] != '"'; ++i) {
      char c = value[i];
      if (c == '\\') {
        if (++i == value.size() || (value[i] != '"' && value[i] != '\\')) {
          return Invalid("a string may escape only \" and \\");
        }
        c = value[i];
      }
      key.push_back(c);
    }
    if (i == value.size()) return Invalid("the string has no closing quote");
    if (i + 1 != value.size()) {
      return Invalid("nothing may follow the string (one key, no parameters)");
    }
  } else {
    key = std::string(value);
  }
  if (key.empty()) return Invalid("the key is empty");
  if (key.size() > kMaxIdempotencyKeyBytes) {
    return Invalid(absl::StrCat("the key is ", key.size(),
                                " bytes; the limit is ",
                                kMaxIdempotencyKeyBytes));
  }
  for (char c : key) {
    if (!Visible(c)) {
      return Invalid("the key must be visible ASCII (no spaces or controls)");
    }
  }
  return key;
}

std::string ScopedKey(const std::vector<std::string>& scope,
                      absl::string_view key) {
  if (scope.empty()) return std::string(key);
  std::vector<absl::string_view> parts(scope.begin(), scope.end());
  std::string encoded = absl::WebSafeBase64Escape(View(Sha256(parts)));
  encoded.resize(22);
  return absl::StrCat(encoded, ":", key);
}

std::string Fingerprint(
    absl::string_view method, absl::string_view target, absl::string_view body,
    const std::vector<std::pair<std::string, std::string>>& headers) {
  const Digest body_digest = Sha256({body});
  std::vector<absl::string_view> parts = {method, target, View(body_digest)};
  for (const auto& [name, value] : headers) {
    parts.emplace_back(name);
    parts.emplace_back(value);
  }
  return absl::BytesToHexString(View(Sha256(parts)));
}

}  // namespace idem::gateway
