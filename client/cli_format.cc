#include "client/cli_format.h"

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/proto_time.h"
#include "google/protobuf/util/json_util.h"

namespace idem::cli {

int ExitCodeFor(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return kExitOk;
    case grpc::StatusCode::NOT_FOUND:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::ALREADY_EXISTS:
    case grpc::StatusCode::ABORTED:
    case grpc::StatusCode::PERMISSION_DENIED:
    case grpc::StatusCode::UNAUTHENTICATED:
      return kExitRefused;
    case grpc::StatusCode::INVALID_ARGUMENT:
      return kExitUsage;
    default:
      return kExitUnavailable;
  }
}

std::string CodeName(grpc::StatusCode code) {
  // absl::StatusCode has the same numbering as grpc::StatusCode.
  const std::string name =
      absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
  return name.empty() ? absl::StrCat("CODE_", static_cast<int>(code)) : name;
}

std::string StatusName(pb::Status status) {
  switch (status) {
    case pb::STATUS_PROCESSING:
      return "PROCESSING";
    case pb::STATUS_SUCCEEDED:
      return "SUCCEEDED";
    case pb::STATUS_FAILED:
      return "FAILED";
    case pb::STATUS_UNKNOWN:
      return "UNKNOWN";
    default:
      return "-";
  }
}

absl::StatusOr<pb::Status> ParseStatus(absl::string_view text) {
  std::string upper = absl::AsciiStrToUpper(text);
  if (!absl::StartsWith(upper, "STATUS_")) upper = "STATUS_" + upper;
  pb::Status status = pb::STATUS_UNSPECIFIED;
  if (!pb::Status_Parse(upper, &status) || status == pb::STATUS_UNSPECIFIED) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown status \"", text,
                     "\"; want processing, succeeded, failed or unknown"));
  }
  return status;
}

absl::StatusOr<absl::Duration> ParseCliDuration(absl::string_view text) {
  absl::Duration d;
  if (!absl::ParseDuration(absl::StripAsciiWhitespace(text), &d) ||
      d == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad duration \"", text, "\"; want e.g. 500ms, 30s, 10m or 1h30m"));
  }
  if (d <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("duration \"", text, "\" must be positive"));
  }
  return d;
}

bool IsPrintableUtf8(absl::string_view bytes) {
  size_t i = 0;
  while (i < bytes.size()) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    if (c < 0x80) {
      if ((c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7f) {
        return false;
      }
      ++i;
      continue;
    }
    int extra = 0;
    uint32_t cp = 0;
    if ((c & 0xe0) == 0xc0) {
      extra = 1;
      cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      extra = 2;
      cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      extra = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + extra >= bytes.size()) return false;
    for (int k = 1; k <= extra; ++k) {
      const auto cc = static_cast<unsigned char>(bytes[i + k]);
      if ((cc & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    // Overlong encodings, surrogates, values past U+10FFFF and the C1
    // control characters are not printable text.
    static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[extra] || (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff ||
        (cp >= 0x80 && cp <= 0x9f)) {
      return false;
    }
    i += extra + 1;
  }
  return true;
}

std::string FormatBody(absl::string_view body) {
  if (body.empty()) return "<empty>";
  if (IsPrintableUtf8(body)) return std::string(body);
  return absl::StrCat("<", body.size(),
                      " bytes, base64: ", absl::Base64Escape(body), ">");
}

namespace {

// Returns e.g. "3m12s ago" or "in 25s", rounded down to whole seconds.
std::string Relative(absl::Time t, absl::Time now) {
  const absl::Duration d = absl::Trunc(now - t, absl::Seconds(1));
  if (d == absl::ZeroDuration()) return "now";
  if (d > absl::ZeroDuration()) return absl::FormatDuration(d) + " ago";
  return "in " + absl::FormatDuration(-d);
}

std::string Age(bool has, const google::protobuf::Timestamp& ts,
                absl::Time now) {
  if (!has) return "-";
  const absl::Duration d = absl::Trunc(now - FromProto(ts), absl::Seconds(1));
  return absl::FormatDuration(std::max(d, absl::ZeroDuration()));
}

std::string Utc(const google::protobuf::Timestamp& ts) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", FromProto(ts),
                          absl::UTCTimeZone());
}

}  // namespace

std::string FormatTimestamp(bool has, const google::protobuf::Timestamp& ts,
                            absl::Time now) {
  if (!has) return "-";
  return absl::StrCat(Utc(ts), " (", Relative(FromProto(ts), now), ")");
}

std::string FormatKey(const pb::RecordKey& key) {
  return absl::StrCat(key.tenant(), "/", key.operation(), "/", key.key());
}

std::string FormatRecord(const pb::Record& record, absl::Time now) {
  std::vector<std::pair<std::string, std::string>> lines = {
      {"tenant", record.key().tenant()},
      {"operation", record.key().operation()},
      {"key", record.key().key()},
      {"status", StatusName(record.status())},
      {"fencing_token", absl::StrCat(record.fencing_token())},
      {"attempt", absl::StrCat(record.attempt())},
      {"request_hash", record.request_hash().empty()
                           ? "-"
                           : absl::BytesToHexString(record.request_hash())},
      {"lease_expires_at", FormatTimestamp(record.has_lease_expires_at(),
                                           record.lease_expires_at(), now)},
      {"created_at",
       FormatTimestamp(record.has_created_at(), record.created_at(), now)},
      {"updated_at",
       FormatTimestamp(record.has_updated_at(), record.updated_at(), now)},
      {"expires_at",
       FormatTimestamp(record.has_expires_at(), record.expires_at(), now)},
      {"retryable", record.retryable() ? "true" : "false"},
      {"resolved_by",
       record.resolved_by().empty() ? "-" : record.resolved_by()},
      {"resolve_reason",
       record.resolve_reason().empty() ? "-" : record.resolve_reason()},
  };
  if (!record.has_result()) {
    lines.emplace_back("result", "-");
  } else {
    const pb::Snapshot& r = record.result();
    lines.emplace_back("result.code", absl::StrCat(r.code()));
    lines.emplace_back("result.content_type",
                       r.content_type().empty() ? "-" : r.content_type());
    std::vector<std::pair<std::string, std::string>> headers(
        r.headers().begin(), r.headers().end());
    std::sort(headers.begin(), headers.end());
    for (const auto& [name, value] : headers) {
      lines.emplace_back("result.header", absl::StrCat(name, ": ", value));
    }
    lines.emplace_back("result.body", FormatBody(r.body()));
  }
  size_t width = 0;
  for (const auto& line : lines) width = std::max(width, line.first.size());
  std::string out;
  for (const auto& [label, value] : lines) {
    const std::string pad(width + 2 - label.size(), ' ');
    // Continuation lines of a multi-line value are indented under it.
    const std::string indent(width + 2, ' ');
    absl::StrAppend(
        &out, label, pad,
        absl::StrJoin(absl::StrSplit(value, '\n'), absl::StrCat("\n", indent)),
        "\n");
  }
  return out;
}

std::string FormatTable(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> widths;
  for (const auto& row : rows) {
    if (widths.size() < row.size()) widths.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) {
      widths[i] = std::max(widths[i], row[i].size());
    }
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size())
        line += std::string(widths[i] - row[i].size() + 2, ' ');
    }
    out += line + "\n";
  }
  return out;
}

std::string FormatRecordTable(
    const google::protobuf::RepeatedPtrField<pb::Record>& records,
    absl::Time now) {
  if (records.empty()) return "";
  std::vector<std::vector<std::string>> rows = {{"TENANT", "OPERATION", "KEY",
                                                 "STATUS", "TOKEN", "ATTEMPT",
                                                 "UPDATED_AT", "AGE"}};
  for (const pb::Record& r : records) {
    rows.push_back({r.key().tenant(), r.key().operation(), r.key().key(),
                    StatusName(r.status()), absl::StrCat(r.fencing_token()),
                    absl::StrCat(r.attempt()),
                    r.has_updated_at() ? Utc(r.updated_at()) : "-",
                    Age(r.has_updated_at(), r.updated_at(), now)});
  }
  return FormatTable(rows);
}

std::string FormatHistory(const pb::HistoryResponse& history) {
  std::vector<std::vector<std::string>> rows = {
      {"AT", "FROM", "TO", "ACTOR", "TOKEN", "REASON"}};
  for (const pb::AuditEntry& e : history.entries()) {
    rows.push_back({e.has_at() ? Utc(e.at()) : "-", StatusName(e.from()),
                    StatusName(e.to()), e.actor().empty() ? "-" : e.actor(),
                    absl::StrCat(e.fencing_token()),
                    e.reason().empty() ? "-" : e.reason()});
  }
  return FormatTable(rows);
}

absl::StatusOr<std::string> ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string out;
  const auto status =
      google::protobuf::util::MessageToJsonString(message, &out, options);
  if (!status.ok()) {
    return absl::InternalError(
        absl::StrCat("cannot print JSON: ", status.ToString()));
  }
  return out;
}

absl::Status ValidateJson(absl::string_view text) {
  if (absl::StripAsciiWhitespace(text).empty()) {
    return absl::InvalidArgumentError("empty, want a JSON value");
  }
  try {
    // Strict RFC 8259: no comments, no trailing commas, valid UTF-8.
    const nlohmann::json parsed =
        nlohmann::json::parse(text.begin(), text.end());
    static_cast<void>(parsed);
  } catch (const nlohmann::json::parse_error& e) {
    // Drop the "[json.exception.parse_error.101] " prefix.
    absl::string_view why = e.what();
    const size_t bracket = why.find("] ");
    if (bracket != absl::string_view::npos) why.remove_prefix(bracket + 2);
    return absl::InvalidArgumentError(absl::StrCat("not valid JSON: ", why));
  }
  return absl::OkStatus();
}

}  // namespace idem::cli
