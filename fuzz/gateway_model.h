// Independent models of the gateway's pure rules (docs/gateway.md), shared
// by gateway_config_fuzzer and gateway_request_fuzzer: what the
// Idempotency-Key field yields, which route a request takes, and the shape
// of the record key and fingerprint the gateway derives.
#ifndef IDEM_FUZZ_GATEWAY_MODEL_H_
#define IDEM_FUZZ_GATEWAY_MODEL_H_

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "fuzz/fuzz_check.h"
#include "server/gateway/gateway_config.h"
#include "server/gateway/request_identity.h"

namespace idem {
namespace fuzz {

// The key in a field value as the contract words it: surrounding spaces and
// tabs dropped; "..." is an sf-string whose only escapes are \" and \\ and
// that nothing follows; anything else is the bare key. Accepted iff 1-200
// bytes of visible ASCII (0x21-0x7e) remain.
inline std::optional<std::string> ModelKey(absl::string_view v) {
  const size_t first = v.find_first_not_of(" \t");
  if (first == absl::string_view::npos) return std::nullopt;
  v = v.substr(first, v.find_last_not_of(" \t") - first + 1);
  std::string key;
  if (v[0] == '"') {
    bool closed = false;
    for (size_t i = 1; i < v.size(); ++i) {
      if (v[i] == '"') {
        if (i + 1 != v.size()) return std::nullopt;
        closed = true;
        break;
      }
      if (v[i] == '\\') {
        if (i + 1 == v.size() || (v[i + 1] != '"' && v[i + 1] != '\\')) {
          return std::nullopt;
        }
        ++i;
      }
      key.push_back(v[i]);
    }
    if (!closed) return std::nullopt;
  } else {
    key = std::string(v);
  }
  if (key.empty() || key.size() > gateway::kMaxIdempotencyKeyBytes) {
    return std::nullopt;
  }
  for (char c : key) {
    if (c < 0x21 || c > 0x7e) return std::nullopt;
  }
  return key;
}

// `key` as an sf-string.
inline std::string Quote(absl::string_view key) {
  std::string out = "\"";
  for (char c : key) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  out.push_back('"');
  return out;
}

// Checks ParseIdempotencyKey(value) against ModelKey; on acceptance the key
// is 1-200 visible ASCII bytes and survives quoting (and, when it could be
// sent bare, sending it bare) unchanged. Returns the key, if any.
inline std::optional<std::string> CheckKey(absl::string_view value) {
  const absl::StatusOr<std::string> got = gateway::ParseIdempotencyKey(value);
  const std::optional<std::string> want = ModelKey(value);
  const std::string shown = absl::StrCat("value \"", absl::CEscape(value),
                                         "\" gave ", got.status().ToString());
  IDEM_FUZZ_CHECK(got.ok() == want.has_value(), shown);
  if (!got.ok()) {
    IDEM_FUZZ_CHECK(
        got.status().code() == absl::StatusCode::kInvalidArgument &&
            absl::StartsWith(got.status().message(), "Idempotency-Key: "),
        shown);
    return std::nullopt;
  }
  IDEM_FUZZ_CHECK(*got == *want, shown + " key \"" + absl::CEscape(*got) +
                                     "\", model \"" + absl::CEscape(*want) +
                                     "\"");
  IDEM_FUZZ_CHECK(!got->empty() &&
                      got->size() <= gateway::kMaxIdempotencyKeyBytes &&
                      std::all_of(got->begin(), got->end(),
                                  [](char c) { return c > 0x20 && c < 0x7f; }),
                  shown);
  const absl::StatusOr<std::string> quoted =
      gateway::ParseIdempotencyKey(Quote(*got));
  IDEM_FUZZ_CHECK(
      quoted.ok() && *quoted == *got,
      "re-quoted " + Quote(*got) + " gave " + quoted.status().ToString());
  if ((*got)[0] != '"') {
    const absl::StatusOr<std::string> bare = gateway::ParseIdempotencyKey(*got);
    IDEM_FUZZ_CHECK(bare.ok() && *bare == *got,
                    "bare " + *got + " gave " + bare.status().ToString());
  }
  return *got;
}

// The path of `target` as the contract matches it, built as text: an
// absolute-form target ("http://host/p", any case of the scheme) loses its
// scheme and authority; the query goes; %XX of unreserved characters is
// decoded; empty and "." segments go and ".." removes the one before.
// nullopt for a target that is neither a path nor an http(s) URI.
inline std::optional<std::string> ModelPath(absl::string_view target) {
  if (target.empty() || target[0] != '/') {
    const size_t sep = target.find("://");
    if (sep == absl::string_view::npos) return std::nullopt;
    const std::string scheme = absl::AsciiStrToLower(target.substr(0, sep));
    if (scheme != "http" && scheme != "https") return std::nullopt;
    target.remove_prefix(sep + 3);
    const size_t path = target.find_first_of("/?");
    target = path == absl::string_view::npos ? absl::string_view()
                                             : target.substr(path);
  }
  target = target.substr(0, target.find('?'));
  std::vector<std::string> kept;
  std::string segment;
  const std::string hex = "0123456789abcdef";
  for (size_t i = 0; i <= target.size(); ++i) {
    if (i == target.size() || target[i] == '/') {
      if (segment == "..") {
        if (!kept.empty()) kept.pop_back();
      } else if (!segment.empty() && segment != ".") {
        kept.push_back(segment);
      }
      segment.clear();
      continue;
    }
    if (target[i] == '%' && i + 2 < target.size()) {
      const size_t high = hex.find(absl::ascii_tolower(target[i + 1]));
      const size_t low = hex.find(absl::ascii_tolower(target[i + 2]));
      if (high != std::string::npos && low != std::string::npos) {
        const char c = static_cast<char>(high * 16 + low);
        if (absl::ascii_isalnum(c) || c == '-' || c == '.' || c == '_' ||
            c == '~') {
          segment.push_back(c);
          i += 2;
          continue;
        }
      }
    }
    segment.push_back(target[i]);
  }
  std::string path;
  for (const std::string& s : kept) absl::StrAppend(&path, "/", s);
  return path.empty() ? "/" : path;
}

// Whether the path of `target` (ModelPath) matches `pattern` ("*" one
// segment, a last "**" any rest, itself included when empty), written
// differently from the gateway: by walking the path's text.
inline bool ModelPathMatches(const std::vector<std::string>& pattern,
                             absl::string_view target) {
  const std::optional<std::string> normal = ModelPath(target);
  if (!normal) return false;
  if (*normal == "/") {
    return pattern.empty() || (pattern.size() == 1 && pattern[0] == "**");
  }
  absl::string_view path = *normal;
  path.remove_prefix(1);
  size_t p = 0;
  while (true) {
    const size_t slash = path.find('/');
    const absl::string_view segment = path.substr(0, slash);
    if (p == pattern.size()) return false;
    if (pattern[p] == "**") return true;
    if (pattern[p] != "*" && pattern[p] != segment) return false;
    ++p;
    if (slash == absl::string_view::npos) break;
    path.remove_prefix(slash + 1);
  }
  return p == pattern.size() || (p + 1 == pattern.size() && pattern[p] == "**");
}

// Checks MatchRoute(config, method, target): the first route whose methods
// hold `method` and whose path matches, by the model; null if none.
inline const gateway::Route* CheckRoute(const gateway::GatewayConfig& config,
                                        absl::string_view method,
                                        absl::string_view target) {
  const gateway::Route* want = nullptr;
  for (const gateway::Route& r : config.routes) {
    if (std::find(r.methods.begin(), r.methods.end(), method) !=
            r.methods.end() &&
        ModelPathMatches(r.path, target)) {
      want = &r;
      break;
    }
  }
  const gateway::Route* got = gateway::MatchRoute(config, method, target);
  const std::string shown = absl::StrCat(
      absl::CEscape(method), " ", absl::CEscape(target), " matched ",
      got ? got->name : "nothing", ", model ", want ? want->name : "nothing");
  IDEM_FUZZ_CHECK(got == want, shown);
  if (got != nullptr) {
    IDEM_FUZZ_CHECK(std::find(got->methods.begin(), got->methods.end(),
                              method) != got->methods.end(),
                    shown);
  }
  return got;
}

inline bool Base64UrlChar(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
         (c >= '0' && c <= '9') || c == '-' || c == '_';
}

// Checks ScopedKey(scope, key): the key itself without scope headers, else
// 22 base64url characters, ':' and the key; at most the 255 bytes of a
// record key; values that join alike ("ab"+"c", "a"+"bc") scope apart.
inline std::string CheckScopedKey(const std::vector<std::string>& scope,
                                  const std::string& key) {
  const std::string scoped = gateway::ScopedKey(scope, key);
  IDEM_FUZZ_CHECK(scoped == gateway::ScopedKey(scope, key),
                  "ScopedKey is not deterministic");
  IDEM_FUZZ_CHECK(scoped.size() <= 255, scoped);
  if (scope.empty()) {
    IDEM_FUZZ_CHECK(scoped == key, scoped);
    return scoped;
  }
  IDEM_FUZZ_CHECK(
      scoped.size() == 23 + key.size() && scoped[22] == ':' &&
          scoped.compare(23, std::string::npos, key) == 0 &&
          std::all_of(scoped.begin(), scoped.begin() + 22, Base64UrlChar),
      scoped);
  if (scope.size() >= 2 && !scope[0].empty()) {
    std::vector<std::string> shifted = scope;
    shifted[1].insert(shifted[1].begin(), shifted[0].back());
    shifted[0].pop_back();
    IDEM_FUZZ_CHECK(gateway::ScopedKey(shifted, key) != scoped,
                    "scope values that join alike share a key: " + scoped);
  }
  return scoped;
}

// Checks Fingerprint: 64 lower-case hex digits, deterministic, and a byte
// moved from the method to the target changes it.
inline std::string CheckFingerprint(
    absl::string_view method, absl::string_view target, absl::string_view body,
    const std::vector<std::pair<std::string, std::string>>& headers) {
  const std::string fp = gateway::Fingerprint(method, target, body, headers);
  IDEM_FUZZ_CHECK(
      fp.size() == 64 && std::all_of(fp.begin(), fp.end(),
                                     [](char c) {
                                       return (c >= '0' && c <= '9') ||
                                              (c >= 'a' && c <= 'f');
                                     }),
      fp);
  IDEM_FUZZ_CHECK(fp == gateway::Fingerprint(method, target, body, headers),
                  "Fingerprint is not deterministic");
  if (!method.empty()) {
    const std::string moved = gateway::Fingerprint(
        method.substr(0, method.size() - 1),
        absl::StrCat(method.substr(method.size() - 1), target), body, headers);
    IDEM_FUZZ_CHECK(moved != fp, "method and target that join alike: " + fp);
  }
  return fp;
}

}  // namespace fuzz
}  // namespace idem

#endif  // IDEM_FUZZ_GATEWAY_MODEL_H_
