#include "server/gateway/replay.h"

#include <boost/beast/http/status.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "server/gateway/gateway_config.h"

namespace idem::gateway {
namespace {

bool LowerCase(absl::string_view name) {
  for (char c : name) {
    if (absl::ascii_isupper(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

}  // namespace

unsigned ReplayStatus(const Record& record) {
  const int32_t code = record.result ? record.result->code : 0;
  if (code >= 200 && code <= 599) return static_cast<unsigned>(code);
  return record.status == Status::kSucceeded ? 200 : 500;
}

boost::beast::http::response<boost::beast::http::string_body> ReplayResponse(
    const Record& record, unsigned version) {
  namespace http = boost::beast::http;
  static const Snapshot kEmpty;
  const Snapshot& s = record.result ? *record.result : kEmpty;
  http::response<http::string_body> res(
      static_cast<http::status>(ReplayStatus(record)), version);
  for (const auto& [name, value] : s.headers) {
    if (!IsHopByHop(name)) res.set(name, value);
  }
  if (!s.content_type.empty()) {
    res.set(http::field::content_type, s.content_type);
  }
  res.set("Idempotent-Replayed", "true");
  res.body() = s.body;
  return res;
}

bool AppendReplay(const Record& record, unsigned version, bool keep_alive,
                  std::string* out) {
  static const Snapshot kEmpty;
  const Snapshot& s = record.result ? *record.result : kEmpty;
  for (const auto& field : s.headers) {
    if (!LowerCase(field.first)) return false;
  }
  const unsigned code = ReplayStatus(record);
  const auto reason = boost::beast::http::obsolete_reason(
      static_cast<boost::beast::http::status>(code));
  absl::StrAppend(out, "HTTP/", version / 10, ".", version % 10, " ", code, " ",
                  absl::string_view(reason.data(), reason.size()), "\r\n");
  // Beast's `set` drops a field of the same name and appends the new one:
  // the fields set after the recorded ones replace them in place of order.
  for (const auto& [name, value] : s.headers) {
    if (IsHopByHop(name) || name == "idempotent-replayed" ||
        (name == "content-type" && !s.content_type.empty())) {
      continue;
    }
    absl::StrAppend(out, name, ": ", value, "\r\n");
  }
  if (!s.content_type.empty()) {
    absl::StrAppend(out, "Content-Type: ", s.content_type, "\r\n");
  }
  out->append("Idempotent-Replayed: true\r\n");
  if (version >= 11 && !keep_alive) out->append("Connection: close\r\n");
  if (version < 11 && keep_alive) out->append("Connection: keep-alive\r\n");
  // These carry no body (RFC 9110 sections 15.3.5, 15.4.5); Beast 1.74
  // still gave them a length, 0.
  const bool bodiless = code == 204 || code == 304;
  absl::StrAppend(out, "Content-Length: ", bodiless ? 0 : s.body.size(),
                  "\r\n\r\n");
  if (bodiless) return true;
  out->append(s.body);
  return true;
}

}  // namespace idem::gateway
