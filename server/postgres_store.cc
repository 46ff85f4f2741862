#include "server/postgres_store.h"

#include <nlohmann/json.hpp>
#include <pqxx/pqxx>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/pg_listener.h"

namespace idem {
namespace {

// The columns every statement returns, in the order ParseRecord reads them.
constexpr char kColumns[] = R"sql(
  tenant_id, operation, idempotency_key, status, request_hash, fencing_token,
  attempt, attempt_id, (extract(epoch FROM lease_expires_at) * 1000000)::bigint,
  result_code, result_body, result_content_type, result_headers::text,
  retryable, (extract(epoch FROM created_at) * 1000000)::bigint,
  (extract(epoch FROM updated_at) * 1000000)::bigint,
  (extract(epoch FROM expires_at) * 1000000)::bigint, resolved_by,
  resolve_reason, tombstone)sql";
constexpr int kColumnCount = 20;

// Microseconds since the epoch as an SQL expression of parameter `p`.
std::string Micros(int p) {
  return absl::StrCat("('epoch'::timestamptz + $", p,
                      "::bigint * interval '1 microsecond')");
}

// now() plus `p` microseconds.
std::string NowPlus(int p) {
  return absl::StrCat("(now() + $", p, "::bigint * interval '1 microsecond')");
}

const std::string& ReadSql() {
  static const std::string* sql = new std::string(absl::StrCat(
      "SELECT ", kColumns,
      ", (extract(epoch FROM n.now) * 1000000)::bigint"
      " FROM (SELECT now() AS now) n LEFT JOIN idempotency_record r"
      " ON r.tenant_id = $1 AND r.operation = $2 AND r.idempotency_key = $3"));
  return *sql;
}

const std::string& InsertSql() {
  static const std::string* sql = new std::string(absl::StrCat(
      "INSERT INTO idempotency_record (tenant_id, operation, idempotency_key,"
      " status, request_hash, fencing_token, attempt, attempt_id,"
      " lease_expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, ",
      NowPlus(9),
      ") ON CONFLICT (tenant_id, operation, idempotency_key) DO NOTHING"
      " RETURNING ",
      kColumns));
  return *sql;
}

// The guarded update, with its audit row in the same statement.
const std::string& UpdateSql() {
  static const std::string* sql = new std::string(absl::StrCat(
      "WITH u AS (UPDATE idempotency_record SET"
      " status = $7, request_hash = $8, fencing_token = $9, attempt = $10,"
      " attempt_id = $11,"
      " lease_expires_at = CASE WHEN $12::bigint < 0 THEN ",
      Micros(13), " ELSE ", NowPlus(12),
      " END,"
      " result_code = CASE WHEN $14::bool THEN $15::integer END,"
      " result_body = CASE WHEN $14::bool THEN $16::bytea END,"
      " result_content_type = CASE WHEN $14::bool THEN $17::text END,"
      " result_headers = CASE WHEN $14::bool THEN $18::jsonb END,"
      " retryable = $19, updated_at = now(),"
      " expires_at = CASE WHEN $20::bigint < 0 THEN NULL ELSE ",
      NowPlus(20),
      " END,"
      " resolved_by = $21, resolve_reason = $22,"
      " tombstone_retention = $29::bigint * interval '1 microsecond',"
      " reconcile_attempts = 0, next_reconcile_at = NULL"
      " WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3"
      " AND status = $4 AND fencing_token = $5"
      " AND (NOT $6::bool OR lease_expires_at <= now())"
      " RETURNING *),"
      " a AS (INSERT INTO idempotency_audit (tenant_id, operation,"
      " idempotency_key, from_status, to_status, actor, reason, fencing_token)"
      " SELECT tenant_id, operation, idempotency_key, $23, $24, $25, $26,"
      " $27 FROM u WHERE $28::bool)"
      " SELECT ",
      kColumns, " FROM u"));
  return *sql;
}

constexpr char kHistorySql[] =
    "SELECT (extract(epoch FROM at) * 1000000)::bigint, from_status,"
    " to_status, actor, reason, fencing_token FROM idempotency_audit"
    " WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3"
    " ORDER BY id";

absl::Time FromMicros(const pqxx::field& f) {
  return absl::FromUnixMicros(f.as<int64_t>());
}

Status StatusOf(const pqxx::field& f) {
  Status s = Status::kProcessing;
  ParseStatus(f.c_str(), &s);
  return s;
}

std::string Bytes(const pqxx::field& f) {
  pqxx::binarystring b(f);
  return b.str();
}

std::string HeadersJson(const std::map<std::string, std::string>& headers) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [k, v] : headers) j[k] = v;
  return j.dump();
}

// Reads a record from the first kColumnCount fields of `row`.
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

constexpr char kExpireSql[] =
    "FROM idempotency_record WHERE status = 'PROCESSING'"
    " AND lease_expires_at <= now() ORDER BY lease_expires_at LIMIT $1"
    " FOR UPDATE SKIP LOCKED";

// Expired terminal records that leave a tombstone become one.
constexpr char kTombstoneSql[] =
    "UPDATE idempotency_record r SET tombstone = true, result_code = NULL,"
    " result_body = NULL, result_content_type = NULL, result_headers = NULL,"
    " expires_at = r.expires_at + r.tombstone_retention"
    " FROM (SELECT tenant_id AS t, operation AS o, idempotency_key AS k"
    " FROM idempotency_record WHERE expires_at <= now()"
    " AND status IN ('SUCCEEDED', 'FAILED') AND NOT tombstone"
    " AND tombstone_retention > interval '0' ORDER BY expires_at LIMIT $1"
    " FOR UPDATE SKIP LOCKED) d WHERE r.tenant_id = d.t AND r.operation = d.o"
    " AND r.idempotency_key = d.k"
    " RETURNING r.tenant_id, r.operation, r.idempotency_key";

// Expired tombstones, and expired terminal records that leave none, go.
constexpr char kPurgeSql[] =
    "DELETE FROM idempotency_record r USING (SELECT tenant_id AS t,"
    " operation AS o, idempotency_key AS k FROM idempotency_record"
    " WHERE expires_at <= now() AND status IN ('SUCCEEDED', 'FAILED')"
    " AND (tombstone OR tombstone_retention = interval '0')"
    " ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED) d"
    " WHERE r.tenant_id = d.t AND r.operation = d.o AND r.idempotency_key = d.k"
    " RETURNING r.tenant_id, r.operation, r.idempotency_key";

// Claims UNKNOWN records due for a probe ($1 operations, $2 their attempt
// limits, $3 backoff and $4 its cap in microseconds, $5 batch size).
const std::string& ClaimSql() {
  static const std::string* sql = new std::string(absl::StrCat(
      "UPDATE idempotency_record r"
      " SET reconcile_attempts = r.reconcile_attempts + 1,"
      " next_reconcile_at = now() + least($4::bigint, ($3::bigint *"
      " power(2, least(r.reconcile_attempts, 30)))::bigint)"
      " * interval '1 microsecond'"
      " FROM (SELECT c.tenant_id AS t, c.operation AS o,"
      " c.idempotency_key AS k FROM idempotency_record c"
      " JOIN unnest($1::text[], $2::integer[]) AS p(op, max_attempts)"
      " ON p.op = c.operation WHERE c.status = 'UNKNOWN'"
      " AND c.reconcile_attempts < p.max_attempts"
      " AND (c.next_reconcile_at IS NULL OR c.next_reconcile_at <= now())"
      " ORDER BY c.next_reconcile_at NULLS FIRST LIMIT $5"
      " FOR UPDATE OF c SKIP LOCKED) d"
      " WHERE r.tenant_id = d.t AND r.operation = d.o"
      " AND r.idempotency_key = d.k RETURNING ",
      kColumns, ", r.reconcile_attempts"));
  return *sql;
}

constexpr char kStatsSql[] =
    "SELECT status, count(*), (extract(epoch FROM now() - min(updated_at))"
    " * 1000000)::bigint FROM idempotency_record GROUP BY status";

// The guarded update (with its audit row) of `w` inside `tx`; nullopt when
// the guard did not hold.
std::optional<Record> ExecUpdate(pqxx::transaction_base& tx, const Write& w) {
  const Record& n = w.next;
  const Snapshot empty;
  const Snapshot& result = n.result ? *n.result : empty;
  const AuditEntry no_audit;
  const AuditEntry& audit = w.audit ? *w.audit : no_audit;
  pqxx::result res = tx.exec_prepared(
      "update", n.key.tenant, n.key.operation, n.key.key,
      StatusName(w.guard->status), w.guard->fencing_token,
      w.guard->lease_expired, StatusName(n.status),
      pqxx::binarystring(n.request_hash), n.fencing_token, n.attempt,
      n.attempt_id, MicrosOrMinus(w.lease),
      absl::ToUnixMicros(n.lease_expires_at), n.result.has_value(), result.code,
      pqxx::binarystring(result.body), result.content_type,
      HeadersJson(result.headers), n.retryable, MicrosOrMinus(w.retention),
      n.resolved_by, n.resolve_reason, StatusName(audit.from),
      StatusName(audit.to), audit.actor, audit.reason, audit.fencing_token,
      w.audit.has_value(), absl::ToInt64Microseconds(w.tombstone_retention));
  if (res.empty()) return std::nullopt;
  return ParseRecord(res[0]);
}

class PostgresStore final : public Store {
 public:
  explicit PostgresStore(const PgOptions& options)
      : pool_(options), listener_(options.conninfo, &feed_) {
    pool_.Prepare("read", ReadSql());
    pool_.Prepare("insert", InsertSql());
    pool_.Prepare("update", UpdateSql());
    pool_.Prepare("history", kHistorySql);
    pool_.Prepare("expire", absl::StrCat("SELECT ", kColumns,
                                         ", (extract(epoch FROM now()) * "
                                         "1000000)::bigint ",
                                         kExpireSql));
    pool_.Prepare("tombstone", kTombstoneSql);
    pool_.Prepare("purge", kPurgeSql);
    pool_.Prepare("claim", ClaimSql());
    pool_.Prepare("stats", kStatsSql);
    pool_.Prepare("ping", "SELECT 1");
    pool_.Prepare("count_processing",
                  "SELECT count(*) FROM idempotency_record WHERE tenant_id = "
                  "$1 AND status = 'PROCESSING'");
  }

  absl::StatusOr<StoreRead> Read(const RecordKey& key) override {
    StoreRead out;
    absl::Status s = pool_.Run("read", [&](pqxx::connection& c) {
      pqxx::nontransaction tx(c);
      pqxx::result res =
          tx.exec_prepared("read", key.tenant, key.operation, key.key);
      const pqxx::row row = res[0];
      out.now = FromMicros(row[kColumnCount]);
      if (!row[0].is_null()) out.record = ParseRecord(row);
    });
    if (!s.ok()) return s;
    return out;
  }

  absl::StatusOr<std::optional<Record>> Apply(const Write& w) override {
    const Record& n = w.next;
    std::optional<Record> out;
    absl::Status s;
    if (!w.guard) {
      if (n.status != Status::kProcessing || n.result || !w.lease) {
        return absl::InternalError("insert of a record not being acquired");
      }
      s = pool_.Run("insert", [&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        pqxx::result res = tx.exec_prepared(
            "insert", n.key.tenant, n.key.operation, n.key.key,
            StatusName(n.status), pqxx::binarystring(n.request_hash),
            n.fencing_token, n.attempt, n.attempt_id,
            absl::ToInt64Microseconds(*w.lease));
        if (!res.empty()) out = ParseRecord(res[0]);
      });
    } else {
      s = pool_.Run("update", [&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        out = ExecUpdate(tx, w);
      });
    }
    if (!s.ok()) return s;
    return out;
  }

  absl::Status Ping() override {
    return pool_.Run("ping", [](pqxx::connection& c) {
      pqxx::nontransaction tx(c);
      tx.exec_prepared("ping");
    });
  }

  absl::StatusOr<std::vector<AuditEntry>> History(
      const RecordKey& key) override {
    std::vector<AuditEntry> out;
    absl::Status s = pool_.Run("history", [&](pqxx::connection& c) {
      pqxx::nontransaction tx(c);
      for (const pqxx::row& row :
           tx.exec_prepared("history", key.tenant, key.operation, key.key)) {
        AuditEntry e;
        e.at = FromMicros(row[0]);
        e.from = StatusOf(row[1]);
        e.to = StatusOf(row[2]);
        e.actor = row[3].c_str();
        e.reason = row[4].c_str();
        e.fencing_token = row[5].as<int64_t>();
        out.push_back(std::move(e));
      }
    });
    if (!s.ok()) return s;
    return out;
  }

  absl::StatusOr<std::vector<Record>> List(const ListQuery& q) override {
    // Not prepared: the planner sees the actual filters and picks an index.
    static const std::string* sql = new std::string(absl::StrCat(
        "SELECT ", kColumns,
        " FROM idempotency_record WHERE ($1 = '' OR tenant_id = $1)"
        " AND ($2 = '' OR operation = $2) AND ($3 = '' OR status = $3)"
        " AND updated_at <= now() - $4::bigint * interval '1 microsecond'"
        " AND (NOT $5::bool OR (updated_at, tenant_id, operation,"
        " idempotency_key) > (",
        Micros(6),
        ", $7, $8, $9)) ORDER BY updated_at, tenant_id, operation,"
        " idempotency_key LIMIT $10"));
    std::vector<Record> out;
    const ListCursor after = q.after.value_or(ListCursor{});
    absl::Status s = pool_.Run("list", [&](pqxx::connection& c) {
      pqxx::nontransaction tx(c);
      for (const pqxx::row& row : tx.exec_params(
               *sql, q.tenant, q.operation,
               q.status ? StatusName(*q.status) : "",
               absl::ToInt64Microseconds(q.older_than), q.after.has_value(),
               q.after ? absl::ToUnixMicros(after.updated_at) : 0,
               after.key.tenant, after.key.operation, after.key.key, q.limit)) {
        out.push_back(ParseRecord(row));
      }
    });
    if (!s.ok()) return s;
    return out;
  }

  absl::StatusOr<std::vector<Record>> ExpireLeases(
      int limit, const ExpireFn& expire) override {
    std::vector<Record> out;
    absl::Status s = pool_.Run("expire", [&](pqxx::connection& c) {
      pqxx::work tx(c);
      pqxx::result due = tx.exec_prepared("expire", limit);
      for (const pqxx::row& row : due) {
        Decision d = expire(ParseRecord(row), FromMicros(row[kColumnCount]));
        if (!d.error.ok() || !d.write) continue;
        std::optional<Record> written = ExecUpdate(tx, *d.write);
        if (written) out.push_back(*std::move(written));
      }
      tx.commit();
    });
    if (!s.ok()) return s;
    return out;
  }

  absl::StatusOr<std::vector<RecordKey>> Purge(int limit) override {
    std::vector<RecordKey> out;
    absl::Status s = pool_.Run("purge", [&](pqxx::connection& c) {
      pqxx::nontransaction tx(c);
      for (const char* statement : {"tombstone", "purge"}) {
        for (const pqxx::row& row : tx.exec_prepared(statement, limit)) {
          out.push_back(
              RecordKey{row[0].c_str(), row[1].c_str(), row[2].c_str()});
        }
      }
    });
    if (!s.ok()) return s;
    return out;
  }

  absl::StatusOr<int64_t> CountProcessing(const std::string& tenant) override {
    int64_t n = 0;
    absl::Status s = pool_.Run("count_processing", [&](pqxx::connection& c) {
      pqxx::nontransaction tx(c);
      n = tx.exec_prepared("count_processing", tenant)[0][0].as<int64_t>();
    });
    if (!s.ok()) return s;
    return n;
  }

  absl::StatusOr<std::vector<ReconcileClaim>> ClaimUnknown(
      const std::map<std::string, int>& max_attempts, absl::Duration backoff,
      absl::Duration max_backoff, int limit) override {
    std::vector<ReconcileClaim> out;
    if (max_attempts.empty()) return out;
    // Operation names are [A-Za-z0-9._:-]: safe in an array literal.
    std::vector<std::string> ops;
    std::vector<std::string> maxes;
    for (const auto& [op, max] : max_attempts) {
      ops.push_back(op);
      maxes.push_back(absl::StrCat(max));
    }
    const std::string op_array =
        absl::StrCat("{", absl::StrJoin(ops, ","), "}");
    const std::string max_array =
        absl::StrCat("{", absl::StrJoin(maxes, ","), "}");
    absl::Status s = pool_.Run("claim", [&](pqxx::connection& c) {
      pqxx::nontransaction tx(c);
      for (const pqxx::row& row : tx.exec_prepared(
               "claim", op_array, max_array, absl::ToInt64Microseconds(backoff),
               absl::ToInt64Microseconds(max_backoff), limit)) {
        out.push_back(
            ReconcileClaim{ParseRecord(row), row[kColumnCount].as<int>()});
      }
    });
    if (!s.ok()) return s;
    return out;
  }

  std::unique_ptr<ChangeFeed::Subscription> Watch(
      const RecordKey& key) override {
    return feed_.Subscribe(key);
  }

  bool WatchLive() override { return feed_.live(); }

  absl::StatusOr<StoreStats> Stats() override {
    StoreStats stats;
    absl::Status s = pool_.Run("stats", [&](pqxx::connection& c) {
      pqxx::nontransaction tx(c);
      for (const pqxx::row& row : tx.exec_prepared("stats")) {
        Status status = StatusOf(row[0]);
        stats.records[status] = row[1].as<int64_t>();
        if (status == Status::kUnknown) {
          stats.oldest_unknown_age = absl::Microseconds(row[2].as<int64_t>());
        }
      }
    });
    if (!s.ok()) return s;
    return stats;
  }

 private:
  PgPool pool_;
  ChangeFeed feed_;
  PgListener listener_;
};

}  // namespace

std::unique_ptr<Store> NewPostgresStore(const PgOptions& options) {
  return std::make_unique<PostgresStore>(options);
}

}  // namespace idem
