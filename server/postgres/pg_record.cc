#include "server/postgres/pg_record.h"

#include <nlohmann/json.hpp>
#include <utility>

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

namespace {

std::string Bytes(const pqxx::field& f) {
  pqxx::binarystring b(f);
  return b.str();
}

}  // namespace

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

Record ParseRecord(const pqxx::row& row) {
  Record r;
  r.key.tenant = row[0].c_str();
  r.key.operation = row[1].c_str();
  r.key.key = row[2].c_str();
  r.status = StatusOf(row[3]);
  r.request_hash = Bytes(row[4]);
  r.fencing_token = row[5].as<int64_t>();
  r.attempt = row[6].as<int32_t>();
  r.attempt_id = row[7].c_str();
  r.lease_expires_at = FromMicros(row[8]);
  if (!row[9].is_null()) {
    Snapshot s;
    s.code = row[9].as<int32_t>();
    s.body = Bytes(row[10]);
    s.content_type = row[11].c_str();
    if (!row[12].is_null()) {
      auto j = nlohmann::json::parse(row[12].c_str());
      for (const auto& [k, v] : j.items()) s.headers[k] = v.get<std::string>();
    }
    r.result = std::move(s);
  }
  r.retryable = row[13].as<bool>();
  r.created_at = FromMicros(row[14]);
  r.updated_at = FromMicros(row[15]);
  if (!row[16].is_null()) r.expires_at = FromMicros(row[16]);
  r.resolved_by = row[17].c_str();
  r.resolve_reason = row[18].c_str();
  r.tombstone = row[19].as<bool>();
  return r;
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
