// How records travel to and from PostgreSQL: the column list every statement
// returns, row parsing, and the time and JSON conversions the statements
// share. Used by the PostgreSQL store and its batched statements.
#ifndef IDEM_SERVER_POSTGRES_PG_RECORD_H_
#define IDEM_SERVER_POSTGRES_PG_RECORD_H_

#include <cstdint>
#include <map>
#include <optional>
#include <pqxx/pqxx>
#include <string>

#include "absl/time/time.h"
#include "statemachine/record.h"

namespace idem {

// The columns every statement returns, in the order ParseRecord reads them,
// unqualified: a statement joining another relation must not reuse these
// names.
extern const char kRecordColumns[];
constexpr int kRecordColumnCount = 20;

// One row of a statement's result in text form, whichever library fetched
// it: libpqxx for the pool's calls, libpq for the lone-call lane (pg_lane.h).
class PgRow {
 public:
  virtual ~PgRow() = default;
  virtual bool IsNull(int i) const = 0;
  // The field's text ("" when null).
  virtual const char* Text(int i) const = 0;
  // Field `i` as a number or a bool; throws std::runtime_error naming the
  // field when it is not one.
  int64_t Int(int i) const;
  bool Bool(int i) const;
  // A bytea field's bytes.
  std::string Bytes(int i) const;
  absl::Time Micros(int i) const { return absl::FromUnixMicros(Int(i)); }
};

// A libpqxx row as a PgRow.
class PqxxRow final : public PgRow {
 public:
  explicit PqxxRow(const pqxx::row& row) : row_(row) {}
  bool IsNull(int i) const override { return row_[i].is_null(); }
  const char* Text(int i) const override { return row_[i].c_str(); }

 private:
  const pqxx::row& row_;
};

// Reads a record from the first kRecordColumnCount fields of `row`.
Record ParseRecord(const PgRow& row);
inline Record ParseRecord(const pqxx::row& row) {
  return ParseRecord(PqxxRow(row));
}

// A timestamp column read as microseconds since the epoch.
absl::Time FromMicros(const pqxx::field& f);
// A status column.
Status StatusOf(const pqxx::field& f);

// Snapshot headers as the JSON object stored in result_headers.
std::string HeadersJson(const std::map<std::string, std::string>& headers);

// A bytea parameter in text form (hex).
std::string ByteaText(const std::string& s);

// A duration as whole microseconds, or -1 when absent.
int64_t MicrosOrMinus(const std::optional<absl::Duration>& d);

// SQL: microseconds since the epoch in parameter `p`, as a timestamptz.
std::string MicrosParam(int p);
// SQL: now() plus parameter `p` microseconds.
std::string NowPlusParam(int p);

}  // namespace idem

#endif  // IDEM_SERVER_POSTGRES_PG_RECORD_H_
