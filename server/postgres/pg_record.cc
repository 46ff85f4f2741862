#include "server/postgres/pg_record.h"

#include <libpq-fe.h>

#include <new>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace idem {

const char kRecordColumns[] = R"sql(
  tenant_id, operation, idempotency_key, status, request_hash, fencing_token,
  attempt, attempt_id, (extract(epoch FROM lease_expires_at) * 1000000)::bigint,
  result_code, result_body, result_content_type, result_headers::text,
  retryable, (extract(epoch FROM created_at) * 1000000)::bigint,
  (extract(epoch FROM updated_at) * 1000000)::bigint,
  (extract(epoch FROM expires_at) * 1000000)::bigint, resolved_by,
  resolve_reason, tombstone)sql";

int64_t PgRow::Int(int i) const {
  int64_t v = 0;
  if (IsNull(i) || !absl::SimpleAtoi(Text(i), &v)) {
    throw std::runtime_error(
        absl::StrCat("column ", i, ": not an integer: '", Text(i), "'"));
  }
  return v;
}

bool PgRow::Bool(int i) const {
  const char* t = Text(i);
  if (IsNull(i) || (t[0] != 't' && t[0] != 'f') || t[1] != '\0') {
    throw std::runtime_error(
        absl::StrCat("column ", i, ": not a bool: '", t, "'"));
  }
  return t[0] == 't';
}

std::string PgRow::Bytes(int i) const {
  size_t n = 0;
  unsigned char* b =
      PQunescapeBytea(reinterpret_cast<const unsigned char*>(Text(i)), &n);
  if (b == nullptr) throw std::bad_alloc();
  std::string out(reinterpret_cast<const char*>(b), n);
  PQfreemem(b);
  return out;
}

absl::Time FromMicros(const pqxx::field& f) {
  return absl::FromUnixMicros(f.as<int64_t>());
}

Status StatusOf(const pqxx::field& f) {
  Status s = Status::kProcessing;
  ParseStatus(f.c_str(), &s);
  return s;
}

std::string HeadersJson(const std::map<std::string, std::string>& headers) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [k, v] : headers) j[k] = v;
  return j.dump();
}

Record ParseRecord(const PgRow& row) {
  Record r;
  r.key.tenant = row.Text(0);
  r.key.operation = row.Text(1);
  r.key.key = row.Text(2);
  ParseStatus(row.Text(3), &r.status);
  r.request_hash = row.Bytes(4);
  r.fencing_token = row.Int(5);
  r.attempt = static_cast<int32_t>(row.Int(6));
  r.attempt_id = row.Text(7);
  r.lease_expires_at = row.Micros(8);
  if (!row.IsNull(9)) {
    Snapshot s;
    s.code = static_cast<int32_t>(row.Int(9));
    s.body = row.Bytes(10);
    s.content_type = row.Text(11);
    if (!row.IsNull(12)) {
      auto j = nlohmann::json::parse(row.Text(12));
      for (const auto& [k, v] : j.items()) s.headers[k] = v.get<std::string>();
    }
    r.result = std::move(s);
  }
  r.retryable = row.Bool(13);
  r.created_at = row.Micros(14);
  r.updated_at = row.Micros(15);
  if (!row.IsNull(16)) r.expires_at = row.Micros(16);
  r.resolved_by = row.Text(17);
  r.resolve_reason = row.Text(18);
  r.tombstone = row.Bool(19);
  return r;
}

std::string ByteaText(const std::string& s) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "\\x";
  out.reserve(2 + 2 * s.size());
  for (unsigned char c : s) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 0xf]);
  }
  return out;
}

int64_t MicrosOrMinus(const std::optional<absl::Duration>& d) {
  return d ? absl::ToInt64Microseconds(*d) : -1;
}

std::string MicrosParam(int p) {
  return absl::StrCat("('epoch'::timestamptz + $", p,
                      "::bigint * interval '1 microsecond')");
}

std::string NowPlusParam(int p) {
  return absl::StrCat("(now() + $", p, "::bigint * interval '1 microsecond')");
}

}  // namespace idem
