#include "server/postgres/postgres_store.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <pqxx/pqxx>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/group_commit.h"
#include "server/base/log.h"
#include "server/base/thread_names.h"
#include "server/postgres/migrate.h"
#include "server/postgres/pg_batch.h"
#include "server/postgres/pg_lane.h"
#include "server/postgres/pg_listener.h"
#include "server/postgres/pg_record.h"

namespace idem {
namespace {

const std::string& ReadSql() {
  static const std::string* sql = new std::string(absl::StrCat(
      "SELECT ", kRecordColumns,
      ", (extract(epoch FROM n.now) * 1000000)::bigint"
      " FROM (SELECT now() AS now) n LEFT JOIN idempotency_record r"
      " ON r.tenant_id = $1 AND r.operation = $2 AND r.idempotency_key = $3"));
  return *sql;
}

// Its columns come from a CTE: Citus refuses a RETURNING that calls a
// function not IMMUTABLE (extract from a timestamptz).
const std::string& InsertSql() {
  static const std::string* sql = new std::string(absl::StrCat(
      "WITH ins AS (INSERT INTO idempotency_record (tenant_id, operation, "
      "idempotency_key,"
      " status, request_hash, fencing_token, attempt, attempt_id,"
      " lease_expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, ",
      NowPlusParam(9),
      ") ON CONFLICT (tenant_id, operation, idempotency_key) DO NOTHING"
      " RETURNING *) SELECT ",
      kRecordColumns, " FROM ins"));
  return *sql;
}

// Begin's first statement: the insert, or else the record it ran into (the
// second branch cannot see a row the first inserted: one snapshot).
const std::string& InsertOrReadSql() {
  static const std::string* sql = new std::string(absl::StrCat(
      "WITH ins AS (INSERT INTO idempotency_record (tenant_id, operation,"
      " idempotency_key, status, request_hash, fencing_token, attempt,"
      " attempt_id, lease_expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, ",
      NowPlusParam(9),
      ") ON CONFLICT (tenant_id, operation, idempotency_key) DO NOTHING"
      " RETURNING *)"
      " SELECT x.*, (extract(epoch FROM now()) * 1000000)::bigint"
      " FROM (SELECT 1) n LEFT JOIN (SELECT ",
      kRecordColumns, ", true FROM ins UNION ALL SELECT ", kRecordColumns,
      ", false FROM idempotency_record WHERE tenant_id = $1"
      " AND operation = $2 AND idempotency_key = $3) x ON true"));
  return *sql;
}

// The guarded update, with its audit row in the same statement.
// The guarded UPDATE of the update statements, RETURNING *; `retention`
// the parameter of the tombstone retention.
std::string GuardedUpdateSql(int retention) {
  return absl::StrCat(
      "UPDATE idempotency_record SET"
      " status = $7, request_hash = $8, fencing_token = $9, attempt = $10,"
      " attempt_id = $11,"
      " lease_expires_at = CASE WHEN $12::bigint < 0 THEN lease_expires_at"
      " ELSE ",
      NowPlusParam(12),
      " END,"
      " result_code = CASE WHEN $13::bool THEN $14::integer END,"
      " result_body = CASE WHEN $13::bool THEN $15::bytea END,"
      " result_content_type = CASE WHEN $13::bool THEN $16::text END,"
      " result_headers = CASE WHEN $13::bool THEN $17::jsonb END,"
      " retryable = $18, updated_at = now(),"
      " expires_at = CASE WHEN $19::bigint < 0 THEN NULL ELSE ",
      NowPlusParam(19),
      " END,"
      " resolved_by = $20, resolve_reason = $21,"
      " tombstone_retention = $",
      retention,
      "::bigint * interval '1 microsecond',"
      " reconcile_attempts = 0, next_reconcile_at = NULL"
      " WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3"
      " AND status = $4 AND fencing_token = $5"
      " AND (NOT $6::bool OR lease_expires_at <= now())"
      " RETURNING *");
}

const std::string& UpdateSql() {
  static const std::string* sql = new std::string(absl::StrCat(
      "WITH u AS (", GuardedUpdateSql(28),
      "),"
      " a AS (INSERT INTO idempotency_audit (tenant_id, operation,"
      " idempotency_key, from_status, to_status, actor, reason, fencing_token)"
      " SELECT tenant_id, operation, idempotency_key, $22, $23, $24, $25,"
      " $26 FROM u WHERE $27::bool)"
      " SELECT ",
      kRecordColumns, ", waited FROM u"));
  return *sql;
}

// The guarded update alone, for a distributed table: Citus runs a statement
// that also inserts the audit row from the update's result in several steps
// through the coordinator, so on Citus the audit row is a statement of its
// own, in the update's transaction (ExecUpdate). Both are on the record's
// shard (the tables are co-located).
const std::string& UpdateOneShardSql() {
  static const std::string* sql = new std::string(
      absl::StrCat("WITH u AS (", GuardedUpdateSql(22), ") SELECT ",
                   kRecordColumns, ", waited FROM u"));
  return *sql;
}

constexpr char kAuditInsertSql[] =
    "INSERT INTO idempotency_audit (tenant_id, operation, idempotency_key,"
    " from_status, to_status, actor, reason, fencing_token)"
    " VALUES ($1, $2, $3, $4, $5, $6, $7, $8)";

constexpr char kHistorySql[] =
    "SELECT (extract(epoch FROM at) * 1000000)::bigint, from_status,"
    " to_status, actor, reason, fencing_token, id FROM idempotency_audit"
    " WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3"
    " AND id > $4 ORDER BY id LIMIT $5";

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
      kRecordColumns, ", r.reconcile_attempts"));
  return *sql;
}

constexpr char kStatsSql[] =
    "SELECT status, count(*), (extract(epoch FROM now() - min(updated_at))"
    " * 1000000)::bigint FROM idempotency_record GROUP BY status";

// On Citus (decision 27) a row lock is refused in a statement over many
// shards, so each background pass scans without one (a multi-shard SELECT)
// and then changes each row it found with a statement on that row's shard
// whose WHERE repeats the scan's conditions: of two instances that found
// the same row, one changes it and the other's statement matches nothing.

// A parked Begin's mark (read_for_waiter_batch's UPDATE, for one key). As
// every statement returning the record's columns after a write, it reads
// them from a CTE: Citus refuses a RETURNING that calls a function not
// IMMUTABLE (extract from a timestamptz).
const std::string& MarkWaitedSql() {
  static const std::string* sql = new std::string(absl::StrCat(
      "WITH m AS (UPDATE idempotency_record SET waited = true"
      " WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3"
      " AND status = 'PROCESSING' AND NOT waited RETURNING *) SELECT ",
      kRecordColumns,
      ", (extract(epoch FROM now()) * 1000000)::bigint FROM m"));
  return *sql;
}

// The read a parked Begin makes when there was nothing to mark.
const std::string& ReadWaitedSql() {
  static const std::string* sql = new std::string(absl::StrCat(
      "SELECT ", kRecordColumns,
      ", (extract(epoch FROM n.now) * 1000000)::bigint, r.waited"
      " FROM (SELECT now() AS now) n LEFT JOIN idempotency_record r"
      " ON r.tenant_id = $1 AND r.operation = $2 AND r.idempotency_key = $3"));
  return *sql;
}

constexpr char kNotifySql[] =
    "SELECT pg_notify('idempotency_record', $1 || E'\\n' || $2 || E'\\n' "
    "|| $3)";

// With the expiry the tombstone gets ($4 then the old one, $5 the new): the
// new one is computed here, as Citus refuses a STABLE function
// (timestamptz + interval) of a column in an UPDATE.
constexpr char kTombstoneScanSql[] =
    "SELECT tenant_id, operation, idempotency_key, expires_at::text,"
    " (expires_at + tombstone_retention)::text FROM idempotency_record"
    " WHERE expires_at <= now() AND status IN ('SUCCEEDED', 'FAILED')"
    " AND NOT tombstone AND tombstone_retention > interval '0'"
    " ORDER BY expires_at LIMIT $1";

constexpr char kTombstoneOneSql[] =
    "UPDATE idempotency_record SET tombstone = true, result_code = NULL,"
    " result_body = NULL, result_content_type = NULL, result_headers = NULL,"
    " expires_at = $5::timestamptz WHERE tenant_id = $1 AND operation = $2"
    " AND idempotency_key = $3 AND expires_at = $4::timestamptz"
    " AND expires_at <= now() AND status IN ('SUCCEEDED', 'FAILED')"
    " AND NOT tombstone AND tombstone_retention > interval '0'"
    " RETURNING tenant_id, operation, idempotency_key";

constexpr char kPurgeScanSql[] =
    "SELECT tenant_id, operation, idempotency_key FROM idempotency_record"
    " WHERE expires_at <= now() AND status IN ('SUCCEEDED', 'FAILED')"
    " AND (tombstone OR tombstone_retention = interval '0')"
    " ORDER BY expires_at LIMIT $1";

constexpr char kPurgeOneSql[] =
    "DELETE FROM idempotency_record WHERE tenant_id = $1 AND operation = $2"
    " AND idempotency_key = $3 AND expires_at <= now()"
    " AND status IN ('SUCCEEDED', 'FAILED')"
    " AND (tombstone OR tombstone_retention = interval '0')"
    " RETURNING tenant_id, operation, idempotency_key";

// $1 operations, $2 their attempt limits, $3 batch size.
constexpr char kClaimScanSql[] =
    "SELECT c.tenant_id, c.operation, c.idempotency_key, c.reconcile_attempts"
    " FROM idempotency_record c"
    " JOIN unnest($1::text[], $2::integer[]) AS p(op, max_attempts)"
    " ON p.op = c.operation WHERE c.status = 'UNKNOWN'"
    " AND c.reconcile_attempts < p.max_attempts"
    " AND (c.next_reconcile_at IS NULL OR c.next_reconcile_at <= now())"
    " ORDER BY c.next_reconcile_at NULLS FIRST LIMIT $3";

// The claim of one scanned record ($4 the attempts the scan saw, $5 backoff
// and $6 its cap in microseconds). The next probe's time comes from $4, not
// the column: Citus refuses a STABLE function (timestamptz + interval) of a
// column in an UPDATE.
const std::string& ClaimOneSql() {
  static const std::string* sql = new std::string(absl::StrCat(
      "WITH c AS (UPDATE idempotency_record"
      " SET reconcile_attempts = $4 + 1,"
      " next_reconcile_at = now() + least($6::bigint, ($5::bigint *"
      " power(2, least($4::integer, 30)))::bigint)"
      " * interval '1 microsecond'"
      " WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3"
      " AND status = 'UNKNOWN' AND reconcile_attempts = $4"
      " AND (next_reconcile_at IS NULL OR next_reconcile_at <= now())"
      " RETURNING *) SELECT ",
      kRecordColumns, ", reconcile_attempts FROM c"));
  return *sql;
}

// The reaper's scan: the expire statement without its row lock.
const std::string& ExpireScanSql() {
  static const std::string* sql = new std::string(absl::StrCat(
      "SELECT ", kRecordColumns,
      ", (extract(epoch FROM now()) * 1000000)::bigint"
      " FROM idempotency_record WHERE status = 'PROCESSING'"
      " AND lease_expires_at <= now() ORDER BY lease_expires_at LIMIT $1"));
  return *sql;
}

// The parameters of "read" for `key`.
std::vector<std::string> ReadParams(const RecordKey& key) {
  return {key.tenant, key.operation, key.key};
}

// The parameters of "insert_or_read" for the create-or-read write `w`.
std::vector<std::string> InsertOrReadParams(const Write& w) {
  const Record& n = w.next;
  return {n.key.tenant,
          n.key.operation,
          n.key.key,
          StatusName(n.status),
          ByteaText(n.request_hash),
          absl::StrCat(n.fencing_token),
          absl::StrCat(n.attempt),
          n.attempt_id,
          absl::StrCat(absl::ToInt64Microseconds(*w.lease))};
}

const char* BoolText(bool b) { return b ? "true" : "false"; }

// The parameters of "update" for the guarded write `w`.
std::vector<std::string> UpdateParams(const Write& w) {
  const Record& n = w.next;
  const Snapshot empty;
  const Snapshot& result = n.result ? *n.result : empty;
  const AuditEntry no_audit;
  const AuditEntry& audit = w.audit ? *w.audit : no_audit;
  return {n.key.tenant,
          n.key.operation,
          n.key.key,
          StatusName(w.guard->status),
          absl::StrCat(w.guard->fencing_token),
          BoolText(w.guard->lease_expired),
          StatusName(n.status),
          ByteaText(n.request_hash),
          absl::StrCat(n.fencing_token),
          absl::StrCat(n.attempt),
          n.attempt_id,
          absl::StrCat(MicrosOrMinus(w.lease)),
          BoolText(n.result.has_value()),
          absl::StrCat(result.code),
          ByteaText(result.body),
          result.content_type,
          HeadersJson(result.headers),
          BoolText(n.retryable),
          absl::StrCat(MicrosOrMinus(w.retention)),
          n.resolved_by,
          n.resolve_reason,
          StatusName(audit.from),
          StatusName(audit.to),
          audit.actor,
          audit.reason,
          absl::StrCat(audit.fencing_token),
          BoolText(w.audit.has_value()),
          absl::StrCat(absl::ToInt64Microseconds(w.tombstone_retention))};
}

// What "read" returned.
StoreRead ReadFrom(const PgRow& row) {
  StoreRead out;
  out.now = row.Micros(kRecordColumnCount);
  if (!row.IsNull(0)) out.record = ParseRecord(row);
  return out;
}

// What "insert_or_read" returned.
InsertOrReadResult InsertOrReadFrom(const PgRow& row) {
  InsertOrReadResult out;
  if (row.IsNull(0)) return out;
  if (row.Bool(kRecordColumnCount)) {
    out.created = ParseRecord(row);
  } else {
    out.existing =
        StoreRead{ParseRecord(row), row.Micros(kRecordColumnCount + 1)};
  }
  return out;
}

// The statements a lone call runs on the lane (pg_lane.h) and, batched or
// not, on the pool.
std::vector<std::pair<std::string, std::string>> LaneStatements() {
  return {{"read", ReadSql()},
          {"insert_or_read", InsertOrReadSql()},
          {"update", UpdateSql()}};
}

// The guarded update (with its audit row) of `w` inside `tx`; nullopt when
// the guard did not hold. `*waited` (when given) gets whether a Begin
// waits on the record written. On a distributed table a write with an audit
// row is two statements: `tx` must then be a transaction.
std::optional<Record> ExecUpdate(const PgPool& pool, pqxx::transaction_base& tx,
                                 const Write& w, bool* waited = nullptr,
                                 bool distributed = false) {
  const Record& n = w.next;
  const AuditEntry no_audit;
  const AuditEntry& audit = w.audit ? *w.audit : no_audit;
  std::vector<std::string> params = UpdateParams(w);
  if (distributed) {
    // update_one_shard: the same but for the audit row's ($22 to $27).
    params.erase(params.begin() + 21, params.begin() + 27);
  }
  pqxx::result res = pool.Exec(tx, distributed ? "update_one_shard" : "update",
                               pqxx::prepare::make_dynamic_params(params));
  if (res.empty()) return std::nullopt;
  if (distributed && w.audit) {
    pool.Exec(tx, "audit_insert", n.key.tenant, n.key.operation, n.key.key,
              StatusName(audit.from), StatusName(audit.to), audit.actor,
              audit.reason, audit.fencing_token);
  }
  if (waited != nullptr) *waited = res[0][kRecordColumnCount].as<bool>();
  return ParseRecord(res[0]);
}

// Whether `w`, written, settles its record: the change the NOTIFY trigger
// of sql/0006 fires on (for a waited record).
bool Settles(const Write& w) {
  return w.guard && w.next.status != Status::kProcessing &&
         w.guard->status != w.next.status;
}

// A parked Begin's read of one record, marking it first, for a distributed
// table: two statements on the record's shard (read_for_waiter_batch would
// span shards). The read runs only when there was nothing to mark; as in the
// batch, a read that finds the record PROCESSING and unmarked (changed since
// the mark missed it) runs both again.
StoreRead ExecReadForWaiterOne(const PgPool& pool, pqxx::transaction_base& tx,
                               const RecordKey& key) {
  constexpr int kPasses = 4;
  StoreRead read;
  for (int pass = 0; pass < kPasses; ++pass) {
    pqxx::result marked =
        pool.Exec(tx, "mark_waited", key.tenant, key.operation, key.key);
    if (!marked.empty()) {
      read.record = ParseRecord(marked[0]);
      read.now = FromMicros(marked[0][kRecordColumnCount]);
      return read;
    }
    const pqxx::row row =
        pool.Exec(tx, "read_waited", key.tenant, key.operation, key.key)[0];
    read.now = FromMicros(row[kRecordColumnCount]);
    read.record.reset();
    if (row[0].is_null()) return read;
    read.record = ParseRecord(row);
    if (read.record->status != Status::kProcessing ||
        row[kRecordColumnCount + 1].as<bool>()) {
      return read;
    }
  }
  return read;
}

// Begin's first step for the create-or-read write `w`, with the single-row
// statement.
InsertOrReadResult ExecInsertOrRead(const PgPool& pool,
                                    pqxx::transaction_base& tx, const Write& w,
                                    bool distributed = false) {
  const Record& n = w.next;
  InsertOrReadResult out;
  if (distributed) {
    // Citus runs insert_or_read in steps, each with its own snapshot: the
    // insert, then (when it ran into a record) the read, each on one shard.
    pqxx::result ins =
        pool.Exec(tx, "insert", n.key.tenant, n.key.operation, n.key.key,
                  StatusName(n.status), pqxx::binarystring(n.request_hash),
                  n.fencing_token, n.attempt, n.attempt_id,
                  absl::ToInt64Microseconds(*w.lease));
    if (!ins.empty()) {
      out.created = ParseRecord(ins[0]);
      return out;
    }
    const pqxx::row row =
        pool.Exec(tx, "read", n.key.tenant, n.key.operation, n.key.key)[0];
    if (!row[0].is_null()) {
      out.existing =
          StoreRead{ParseRecord(row), FromMicros(row[kRecordColumnCount])};
    }
    return out;
  }
  const pqxx::result res =
      pool.Exec(tx, "insert_or_read",
                pqxx::prepare::make_dynamic_params(InsertOrReadParams(w)));
  return InsertOrReadFrom(PqxxRow(res[0]));
}

// Run by the pool on each connection it opens. A backend's first settle of
// a waited-on record takes about 10 ms more than its later ones (1.5 ms,
// psql on PostgreSQL 15): it loads the table's catalog entries, compiles
// the notify trigger and the header check. Here that is paid before the
// connection serves a caller, by the hot path's statements on a record of
// the connection's own, which the rollback takes back (its NOTIFY too).
// The call that opened the connection waits for it: should another session
// hold a lock it needs (an operator's maintenance), it gives up after 50 ms.
// On a distributed table it warms the statements used there: the
// single-row ones (decision 27) and those of a batch's tenant (decision 29).
void WarmUp(const PgPool& pool, pqxx::connection& c, bool distributed) {
  pqxx::work tx(c);
  tx.exec0(
      "SET LOCAL lock_timeout = '50ms'; SET LOCAL statement_timeout = '1s'");
  const RecordKey key{"idem.warm-up", "warm-up",
                      absl::StrCat("backend-", c.backendpid())};
  BeginCommand begin;
  begin.request_hash = std::string(32, 'w');
  const Decision acquire =
      DecideBegin(std::nullopt, key, begin, absl::Now(), Policy{});
  const InsertOrReadResult inserted =
      ExecInsertOrRead(pool, tx, *acquire.write, distributed);
  if (!inserted.created) return;
  // Run into the record, read it, and mark it waited on: the settle below
  // then fires the trigger.
  if (distributed) {
    ExecInsertOrRead(pool, tx, *acquire.write, distributed);
    pool.Exec(tx, "read", key.tenant, key.operation, key.key);
    ExecReadForWaiterOne(pool, tx, key);
    ExecInsertOrReadShardBatch(pool, tx, {&*acquire.write});
    ExecReadShardBatch(pool, tx, {&key});
  } else {
    ExecInsertOrReadBatch(pool, tx, {&*acquire.write});
    ExecReadBatch(pool, tx, {&key});
    ExecReadForWaiterBatch(pool, tx, {&key});
  }
  CompleteCommand complete;
  complete.fencing_token = inserted.created->fencing_token;
  complete.result =
      Snapshot{200, "{}", "application/json", {{"x-warm-up", "1"}}};
  const Decision settle = DecideComplete(*inserted.created, complete, Policy{});
  ExecUpdate(pool, tx, *settle.write, nullptr, distributed);
  // Its guard no longer holds: planned and run, it changes nothing.
  if (distributed) {
    pool.Exec(tx, "audit_insert", key.tenant, key.operation, key.key,
              "PROCESSING", "SUCCEEDED", "warm-up", "", 1);
    pool.Exec(tx, "notify", key.tenant, key.operation, key.key);
    std::vector<bool> waited;
    ExecUpdateShardBatch(pool, tx, {&*settle.write}, &waited);
  } else {
    ExecUpdateBatch(pool, tx, {&*settle.write});
  }
  tx.abort();
}

class PostgresStore final : public Store {
 public:
  int PoolInUse() { return pool_.InUse(); }
  uint64_t LaneCalls() const { return lane_ ? lane_->Sent() : 0; }

  PostgresStore(const PgOptions& options, const PgBatchOptions& batch)
      : single_rows_(!batch.always),
        pool_(options),
        listener_(options.direct_conninfo.empty() ? options.conninfo
                                                  : options.direct_conninfo,
                  &feed_),
        async_reads_(
            batch.max_batch, Threads(options, batch),
            [this](std::vector<AsyncRead>& b) { FlushAsyncReads(b); },
            thread_names::kPgRead),
        async_acquires_(
            batch.max_batch, Threads(options, batch),
            [this](std::vector<AsyncAcquire>& b) {
              FlushAsync(b, [this](const std::vector<AcquireCall*>& calls) {
                FlushAcquires(calls);
              });
            },
            thread_names::kPgInsert),
        async_updates_(
            batch.max_batch, Threads(options, batch),
            [this](std::vector<AsyncUpdate>& b) {
              std::vector<Record> settled;
              FlushAsync(b, [&](const std::vector<WriteCall*>& calls) {
                FlushWrites(calls);
                settled = Settled(calls);
              });
              // After the writers' answers: Complete is not held up by the
              // Begins parked on its record.
              for (const Record& r : settled) feed_.PublishSettled(r);
            },
            thread_names::kPgUpdate),
        counts_(
            1, 1,
            [this](std::vector<AsyncCount>& b) {
              for (AsyncCount& c : b) c.done(CountOne(c.tenant));
            },
            thread_names::kPgCount),
        admin_(
            1, kAdminThreads,
            [](std::vector<std::function<void()>>& b) {
              for (std::function<void()>& query : b) query();
            },
            thread_names::kPgAdmin),
        lane_(batch.lone_lane && !batch.always
                  ? std::make_unique<PgLane>(options, LaneStatements())
                  : nullptr) {
    for (auto& [name, sql] : BatchStatements()) pool_.Prepare(name, sql);
    for (auto& [name, sql] : LaneStatements()) pool_.Prepare(name, sql);
    pool_.Prepare("insert", InsertSql());
    pool_.Prepare("update_one_shard", UpdateOneShardSql());
    pool_.Prepare("audit_insert", kAuditInsertSql);
    pool_.Prepare("history", kHistorySql);
    pool_.Prepare("expire", absl::StrCat("SELECT ", kRecordColumns,
                                         ", (extract(epoch FROM now()) * "
                                         "1000000)::bigint ",
                                         kExpireSql));
    pool_.Prepare("tombstone", kTombstoneSql);
    pool_.Prepare("purge", kPurgeSql);
    pool_.Prepare("claim", ClaimSql());
    pool_.Prepare("stats", kStatsSql);
    pool_.Prepare("mark_waited", MarkWaitedSql());
    pool_.Prepare("read_waited", ReadWaitedSql());
    pool_.Prepare("notify", kNotifySql);
    pool_.Prepare("expire_scan", ExpireScanSql());
    pool_.Prepare("tombstone_scan", kTombstoneScanSql);
    pool_.Prepare("tombstone_one", kTombstoneOneSql);
    pool_.Prepare("purge_scan", kPurgeScanSql);
    pool_.Prepare("purge_one", kPurgeOneSql);
    pool_.Prepare("claim_scan", kClaimScanSql);
    pool_.Prepare("claim_one", ClaimOneSql());
    pool_.Prepare("ping", "SELECT 1");
    pool_.Prepare("count_processing",
                  "SELECT count(*) FROM idempotency_record WHERE tenant_id = "
                  "$1 AND status = 'PROCESSING'");
    pool_.OnConnect([this](pqxx::connection& c) {
      // Each new connection looks again: --migrate may have distributed the
      // tables since the last.
      const bool distributed = IsDistributed(c);
      distributed_.store(distributed, std::memory_order_relaxed);
      layout_known_.store(true, std::memory_order_release);
      WarmUp(pool_, c, distributed);
    });
  }

  // Each record call is queued for the store's threads of its kind, which
  // fold the calls queued meanwhile into one batch statement.
  // A call with the lane free (pg_lane.h) goes to PostgreSQL from the
  // caller's thread and is answered from the lane's.
  void Read(const RecordKey& key, ReadFn done) override {
    if (LaneOpen(async_reads_) &&
        lane_->TrySend("read", "read", ReadParams(key), [&] {
          return [done = std::move(done)](absl::StatusOr<PgResult> r) {
            done(FromLane<StoreRead>("read", r, [](const PgResult& res) {
              return ReadFrom(res.At(0));
            }));
          };
        })) {
      return;
    }
    async_reads_.Submit(AsyncRead{key, std::move(done), false});
  }

  // Batched with the plain reads, as its own statement.
  void ReadForWaiter(const RecordKey& key, ReadFn done) override {
    async_reads_.Submit(AsyncRead{key, std::move(done), true});
  }

  void InsertOrRead(const Write& w, InsertOrReadFn done) override {
    if (absl::Status s = CheckInsert(w); !s.ok()) return done(s);
    // While Begins mostly find their record (BeginMix) the batch threads
    // read first.
    if (LaneOpen(async_acquires_) && !mix_.ReadFirst() &&
        lane_->TrySend(
            "insert_or_read", "insert_or_read", InsertOrReadParams(w), [&] {
              return
                  [this, done = std::move(done)](absl::StatusOr<PgResult> r) {
                    absl::StatusOr<InsertOrReadResult> found =
                        FromLane<InsertOrReadResult>(
                            "insert_or_read", r, [](const PgResult& res) {
                              return InsertOrReadFrom(res.At(0));
                            });
                    if (found.ok()) {
                      ObserveMix(found->existing ? 1 : 0, 1);
                    }
                    done(std::move(found));
                  };
            })) {
      return;
    }
    async_acquires_.Submit(
        AsyncAcquire{w, AcquireCall{nullptr, absl::UnknownError("not run")},
                     std::move(done)});
  }

  // Guarded updates (a holder's Complete, Fail, Heartbeat, an expiry) are
  // batched; an insert decided after a read (the record vanished, or a
  // tenant cap counted first) is rare and runs alone, on the same threads.
  void Apply(const Write& w, ApplyFn done) override {
    if (!w.guard) {
      if (absl::Status s = CheckInsert(w); !s.ok()) return done(s);
    } else if (LaneOpen(async_updates_) &&
               lane_->TrySend("update", "update", UpdateParams(w), [&] {
                 return [this,
                         done = std::move(done)](absl::StatusOr<PgResult> r) {
                   absl::StatusOr<std::optional<Record>> written =
                       FromLane<std::optional<Record>>(
                           "update", r,
                           [](const PgResult& res) -> std::optional<Record> {
                             if (res.Rows() == 0) return std::nullopt;
                             return ParseRecord(res.At(0));
                           });
                   std::optional<Record> settled;
                   if (written.ok() && *written &&
                       (*written)->status != Status::kProcessing) {
                     settled = **written;
                   }
                   done(std::move(written));
                   // After the writer's answer, as the batch threads do.
                   if (settled) feed_.PublishSettled(*settled);
                 };
               })) {
      return;
    }
    async_updates_.Submit(AsyncUpdate{
        w, WriteCall{nullptr, absl::UnknownError("not run")}, std::move(done)});
  }

  void CountProcessing(const std::string& tenant, CountFn done) override {
    counts_.Submit(AsyncCount{tenant, std::move(done)});
  }

  absl::Status Ping() override {
    return pool_.Run("ping", [this](pqxx::connection& c) {
      pqxx::nontransaction tx(c);
      pool_.Exec(tx, "ping");
    });
  }

  // Admin queries run on threads of their own, so that a slow listing
  // never holds up the record calls' batches.
  void History(const HistoryQuery& query, HistoryFn done) override {
    admin_.Submit(
        [this, query, done = std::move(done)] { done(HistoryNow(query)); });
  }

  void List(const ListQuery& query, ListFn done) override {
    admin_.Submit(
        [this, query, done = std::move(done)] { done(ListNow(query)); });
  }

  absl::StatusOr<std::vector<AuditEntry>> HistoryNow(const HistoryQuery& q) {
    std::vector<AuditEntry> out;
    absl::Status s = pool_.Run("history", [&](pqxx::connection& c) {
      pqxx::nontransaction tx(c);
      for (const pqxx::row& row :
           pool_.Exec(tx, "history", q.key.tenant, q.key.operation, q.key.key,
                      q.after_id, q.limit)) {
        AuditEntry e;
        e.at = FromMicros(row[0]);
        e.from = StatusOf(row[1]);
        e.to = StatusOf(row[2]);
        e.actor = row[3].c_str();
        e.reason = row[4].c_str();
        e.fencing_token = row[5].as<int64_t>();
        e.id = row[6].as<int64_t>();
        out.push_back(std::move(e));
      }
    });
    if (!s.ok()) return s;
    return out;
  }

  absl::StatusOr<std::vector<Record>> ListNow(const ListQuery& q) {
    // Not prepared: the planner sees the actual filters and picks an index.
    // bytes_before is the ResultBytes of the rows ahead in the page but the
    // one just before ($11: the byte bound, 0 none); octet_length reads a
    // stored body's size without fetching it. The page is cut before the
    // sizes are summed, and a tenant, when given, is an equality: on Citus
    // the page then comes from one shard, or else from each shard's first
    // rows merged on the coordinator, which then sums (Citus pushes a
    // subquery in the SELECT list down to the shards only below a window).
    const auto list_sql = [](const char* tenant_filter) {
      return new std::string(absl::StrCat(
          "SELECT ", kRecordColumns,
          " FROM (SELECT *, sum(v_size) OVER (ORDER BY updated_at, tenant_id,"
          " operation, idempotency_key"
          " ROWS BETWEEN UNBOUNDED PRECEDING AND 2 PRECEDING) AS bytes_before"
          " FROM (SELECT *, coalesce(octet_length(result_body), 0)"
          " + coalesce(octet_length(result_content_type), 0)"
          " + coalesce((SELECT sum(octet_length(h.k) + octet_length(h.v))"
          " FROM jsonb_each_text(result_headers) AS h(k, v)), 0) AS v_size"
          " FROM idempotency_record WHERE ",
          tenant_filter,
          " AND ($2 = '' OR operation = $2) AND ($3 = '' OR status = $3)"
          " AND updated_at <= now() - $4::bigint * interval '1 microsecond'"
          " AND (NOT $5::bool OR (updated_at, tenant_id, operation,"
          " idempotency_key) > (",
          MicrosParam(6),
          ", $7, $8, $9)) ORDER BY updated_at, tenant_id, operation,"
          " idempotency_key LIMIT $10) l) r"
          " WHERE $11::bigint = 0 OR coalesce(r.bytes_before, 0) < $11::bigint"
          " ORDER BY updated_at, tenant_id, operation, idempotency_key"));
    };
    static const std::string* by_tenant = list_sql("tenant_id = $1");
    static const std::string* all_tenants = list_sql("$1 = ''");
    const std::string* sql = q.tenant.empty() ? all_tenants : by_tenant;
    std::vector<Record> out;
    const ListCursor after = q.after.value_or(ListCursor{});
    absl::Status s = pool_.Run("list", [&](pqxx::connection& c) {
      pqxx::nontransaction tx(c);
      for (const pqxx::row& row : tx.exec_params(
               *sql, q.tenant, q.operation,
               q.status ? StatusName(*q.status) : "",
               absl::ToInt64Microseconds(q.older_than), q.after.has_value(),
               q.after ? absl::ToUnixMicros(after.updated_at) : 0,
               after.key.tenant, after.key.operation, after.key.key, q.limit,
               static_cast<int64_t>(q.max_bytes))) {
        out.push_back(ParseRecord(row));
      }
    });
    if (!s.ok()) return s;
    return out;
  }

  absl::StatusOr<std::vector<Record>> ExpireLeases(
      int limit, const ExpireFn& expire) override {
    if (Distributed()) return ExpireLeasesPerRow(limit, expire);
    std::vector<Record> out;
    absl::Status s = pool_.Run("expire", [&](pqxx::connection& c) {
      pqxx::work tx(c);
      pqxx::result due = pool_.Exec(tx, "expire", limit);
      for (const pqxx::row& row : due) {
        Decision d =
            expire(ParseRecord(row), FromMicros(row[kRecordColumnCount]));
        if (!d.error.ok() || !d.write) continue;
        std::optional<Record> written = ExecUpdate(pool_, tx, *d.write);
        if (written) out.push_back(*std::move(written));
      }
      tx.commit();
    });
    if (!s.ok()) return s;
    return out;
  }

  absl::StatusOr<std::vector<RecordKey>> Purge(int limit) override {
    if (Distributed()) return PurgePerRow(limit);
    std::vector<RecordKey> out;
    absl::Status s = pool_.Run("purge", [&](pqxx::connection& c) {
      pqxx::nontransaction tx(c);
      for (const char* statement : {"tombstone", "purge"}) {
        for (const pqxx::row& row : pool_.Exec(tx, statement, limit)) {
          out.push_back(
              RecordKey{row[0].c_str(), row[1].c_str(), row[2].c_str()});
        }
      }
    });
    if (!s.ok()) return s;
    return out;
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
    if (Distributed()) {
      return ClaimPerRow(op_array, max_array, backoff, max_backoff, limit);
    }
    absl::Status s = pool_.Run("claim", [&](pqxx::connection& c) {
      pqxx::nontransaction tx(c);
      for (const pqxx::row& row :
           pool_.Exec(tx, "claim", op_array, max_array,
                      absl::ToInt64Microseconds(backoff),
                      absl::ToInt64Microseconds(max_backoff), limit)) {
        out.push_back(ReconcileClaim{ParseRecord(row),
                                     row[kRecordColumnCount].as<int>()});
      }
    });
    if (!s.ok()) return s;
    return out;
  }

  ChangeFeed* Changes() override { return &feed_; }

  absl::StatusOr<StoreStats> Stats() override {
    StoreStats stats;
    absl::Status s = pool_.Run("stats", [&](pqxx::connection& c) {
      pqxx::nontransaction tx(c);
      for (const pqxx::row& row : pool_.Exec(tx, "stats")) {
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
  struct ReadCall {
    const RecordKey* key;
    absl::StatusOr<StoreRead> result;
  };
  struct WriteCall {
    const Write* write;
    absl::StatusOr<std::optional<Record>> result;
  };
  struct AcquireCall {
    const Write* write;
    absl::StatusOr<InsertOrReadResult> result;
  };

  // A call of a caller that must not block, queued for a store thread.
  template <typename Call, typename Fn>
  struct AsyncCall {
    Write write;
    Call call;  // call.write points at write once queued
    Fn done;
  };
  using AsyncAcquire = AsyncCall<AcquireCall, InsertOrReadFn>;
  using AsyncUpdate = AsyncCall<WriteCall, ApplyFn>;
  struct AsyncRead {
    RecordKey key;
    ReadFn done;
    bool for_waiter;  // ReadForWaiter
  };
  struct AsyncCount {
    std::string tenant;
    CountFn done;
  };

  // Whether a call may take the lane: it is on, the tables are known to be
  // plain PostgreSQL's (on Citus a call's statements differ), and the batch
  // threads of its kind have nothing to do. Under load the calls fold into
  // batches, as without the lane, and the lane stays for the lone call.
  template <typename Item>
  bool LaneOpen(const BatchThreads<Item>& threads) const {
    return lane_ != nullptr && layout_known_.load(std::memory_order_acquire) &&
           !distributed_.load(std::memory_order_relaxed) && threads.Quiet();
  }

  // A lane result parsed by `parse`, or its failure; a row that does not
  // parse is INTERNAL, as in the pool's calls.
  template <typename T, typename Parse>
  static absl::StatusOr<T> FromLane(const char* context,
                                    const absl::StatusOr<PgResult>& r,
                                    const Parse& parse) {
    if (!r.ok()) return r.status();
    try {
      return parse(*r);
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat(context, ": ", e.what()));
    }
  }

  // Whether the tables are distributed (Citus): then every statement names
  // one record's tenant or reads without row locks (decision 27).
  // Known once a connection has been opened (OnConnect): the first call
  // opens one if none has been, so that it picks its statements knowing.
  bool Distributed() {
    if (!layout_known_.load(std::memory_order_acquire)) {
      pool_.Run("layout", [](pqxx::connection&) {}).IgnoreError();
    }
    return distributed_.load(std::memory_order_relaxed);
  }

  // On Citus a settle's NOTIFY is the store's: sent on the coordinator
  // after the settling statement committed, for a record a Begin waits on.
  void NotifyIfWaited(pqxx::transaction_base& tx, const Write& w,
                      const std::optional<Record>& written, bool waited) {
    if (!Distributed() || !written || !waited || !Settles(w)) return;
    const RecordKey& k = w.next.key;
    // The write has committed: its caller gets its answer whatever happens
    // here. Without the NOTIFY, other instances' Begins parked on the record
    // wake at their own deadline.
    try {
      pool_.Exec(tx, "notify", k.tenant, k.operation, k.key);
    } catch (...) {
      Log(LogLevel::kWarn,
          "could not notify the waiters of a settled record; they wake at "
          "their deadline",
          {{"error",
            std::string(StatusFromCurrentException("notify").message())}});
    }
  }

  absl::StatusOr<std::vector<Record>> ExpireLeasesPerRow(
      int limit, const ExpireFn& expire) {
    std::vector<Record> out;
    absl::Status s = pool_.Run("expire_scan", [&](pqxx::connection& c) {
      // One transaction, one commit (Citus commits it in two phases when
      // it wrote on two workers); its NOTIFYs are the coordinator's, sent
      // at that commit.
      pqxx::work tx(c);
      for (const pqxx::row& row : pool_.Exec(tx, "expire_scan", limit)) {
        Decision d =
            expire(ParseRecord(row), FromMicros(row[kRecordColumnCount]));
        if (!d.error.ok() || !d.write) continue;
        bool waited = false;
        std::optional<Record> written =
            ExecUpdate(pool_, tx, *d.write, &waited, true);
        if (!written) continue;
        if (waited && Settles(*d.write)) {
          const RecordKey& k = written->key;
          pool_.Exec(tx, "notify", k.tenant, k.operation, k.key);
        }
        out.push_back(*std::move(written));
      }
      tx.commit();
    });
    if (!s.ok()) return s;
    return out;
  }

  absl::StatusOr<std::vector<RecordKey>> PurgePerRow(int limit) {
    std::vector<RecordKey> out;
    absl::Status s = pool_.Run("purge_scan", [&](pqxx::connection& c) {
      // One commit per pass, as in ExpireLeasesPerRow.
      pqxx::work tx(c);
      const auto keep = [&](const pqxx::result& changed) {
        for (const pqxx::row& row : changed) {
          out.push_back(
              RecordKey{row[0].c_str(), row[1].c_str(), row[2].c_str()});
        }
      };
      for (const pqxx::row& found : pool_.Exec(tx, "tombstone_scan", limit)) {
        keep(pool_.Exec(tx, "tombstone_one", found[0].c_str(), found[1].c_str(),
                        found[2].c_str(), found[3].c_str(), found[4].c_str()));
      }
      for (const pqxx::row& found : pool_.Exec(tx, "purge_scan", limit)) {
        keep(pool_.Exec(tx, "purge_one", found[0].c_str(), found[1].c_str(),
                        found[2].c_str()));
      }
      tx.commit();
    });
    if (!s.ok()) return s;
    return out;
  }

  absl::StatusOr<std::vector<ReconcileClaim>> ClaimPerRow(
      const std::string& op_array, const std::string& max_array,
      absl::Duration backoff, absl::Duration max_backoff, int limit) {
    std::vector<ReconcileClaim> out;
    absl::Status s = pool_.Run("claim_scan", [&](pqxx::connection& c) {
      // One commit per pass, as in ExpireLeasesPerRow.
      pqxx::work tx(c);
      for (const pqxx::row& found :
           pool_.Exec(tx, "claim_scan", op_array, max_array, limit)) {
        for (const pqxx::row& row :
             pool_.Exec(tx, "claim_one", found[0].c_str(), found[1].c_str(),
                        found[2].c_str(), found[3].as<int>(),
                        absl::ToInt64Microseconds(backoff),
                        absl::ToInt64Microseconds(max_backoff))) {
          out.push_back(ReconcileClaim{ParseRecord(row),
                                       row[kRecordColumnCount].as<int>()});
        }
      }
      tx.commit();
    });
    if (!s.ok()) return s;
    return out;
  }

  // Admin queries at once: one may page through a large table while
  // another answers History.
  static constexpr int kAdminThreads = 2;

  // Threads per kind of call: the batches of a kind in flight at once; with
  // batching off, one per connection, as each call then is a statement.
  static int Threads(const PgOptions& options, const PgBatchOptions& batch) {
    return batch.max_batch > 1 || batch.always ? batch.inflight
                                               : options.pool_size;
  }

  absl::StatusOr<int64_t> CountOne(const std::string& tenant) {
    int64_t n = 0;
    absl::Status s = pool_.Run("count_processing", [&](pqxx::connection& c) {
      pqxx::nontransaction tx(c);
      n = pool_.Exec(tx, "count_processing", tenant)[0][0].as<int64_t>();
    });
    if (!s.ok()) return s;
    return n;
  }

  void FlushAsyncReads(std::vector<AsyncRead>& batch) {
    std::vector<ReadCall> reads;
    reads.reserve(batch.size());
    for (AsyncRead& a : batch) {
      reads.push_back(ReadCall{&a.key, absl::UnknownError("not run")});
    }
    std::vector<ReadCall*> plain;
    std::vector<ReadCall*> for_waiters;
    for (size_t i = 0; i < batch.size(); ++i) {
      (batch[i].for_waiter ? for_waiters : plain).push_back(&reads[i]);
    }
    if (!plain.empty()) FlushReads(plain);
    if (!for_waiters.empty()) FlushWaiterReads(for_waiters);
    for (size_t i = 0; i < batch.size(); ++i) {
      batch[i].done(std::move(reads[i].result));
    }
  }

  // Parked Begins' reads, which mark their records first: always the batch
  // statement (they are rare; a single-row twin would add nothing).
  void FlushWaiterReads(const std::vector<ReadCall*>& batch) {
    if (Distributed()) {
      for (ReadCall* call : batch) {
        StoreRead read;
        absl::Status s = pool_.Run("read_for_waiter", [&](pqxx::connection& c) {
          pqxx::nontransaction tx(c);
          read = ExecReadForWaiterOne(pool_, tx, *call->key);
        });
        call->result = s.ok() ? absl::StatusOr<StoreRead>(std::move(read))
                              : absl::StatusOr<StoreRead>(s);
      }
      return;
    }
    const auto run = [&](const std::vector<const RecordKey*>& keys,
                         std::vector<StoreRead>* reads) {
      return pool_.Run("read_for_waiter_batch", [&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        *reads = ExecReadForWaiterBatch(pool_, tx, keys);
      });
    };
    std::vector<const RecordKey*> keys;
    keys.reserve(batch.size());
    for (ReadCall* call : batch) keys.push_back(call->key);
    std::vector<StoreRead> reads;
    if (absl::Status s = run(keys, &reads); !s.ok()) {
      return Fallback(s, batch,
                      [&](ReadCall* call) -> absl::StatusOr<StoreRead> {
                        std::vector<StoreRead> one;
                        if (absl::Status s1 = run({call->key}, &one); !s1.ok())
                          return s1;
                        return std::move(one[0]);
                      });
    }
    for (size_t i = 0; i < batch.size(); ++i) {
      batch[i]->result = std::move(reads[i]);
    }
  }

  static absl::Status CheckInsert(const Write& w) {
    const Record& n = w.next;
    if (n.status != Status::kProcessing || n.result || !w.lease) {
      return absl::InternalError("insert of a record not being acquired");
    }
    return absl::OkStatus();
  }

  // One InsertOrRead, with the single-row statement.
  absl::StatusOr<InsertOrReadResult> InsertOrReadOne(const Write& w) {
    InsertOrReadResult out;
    absl::Status s = pool_.Run("insert_or_read", [&](pqxx::connection& c) {
      pqxx::nontransaction tx(c);
      out = ExecInsertOrRead(pool_, tx, w, Distributed());
    });
    if (!s.ok()) return s;
    return out;
  }

  // One read, with the single-row statement.
  absl::StatusOr<StoreRead> ReadOne(const RecordKey& key) {
    StoreRead out;
    absl::Status s = pool_.Run("read", [&](pqxx::connection& c) {
      pqxx::nontransaction tx(c);
      const pqxx::result res = pool_.Exec(
          tx, "read", pqxx::prepare::make_dynamic_params(ReadParams(key)));
      out = ReadFrom(PqxxRow(res[0]));
    });
    if (!s.ok()) return s;
    return out;
  }

  // One write, with the single-row statements.
  absl::StatusOr<std::optional<Record>> ApplyOne(const Write& w) {
    const Record& n = w.next;
    std::optional<Record> out;
    absl::Status s;
    if (!w.guard) {
      s = pool_.Run("insert", [&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        pqxx::result res =
            pool_.Exec(tx, "insert", n.key.tenant, n.key.operation, n.key.key,
                       StatusName(n.status), pqxx::binarystring(n.request_hash),
                       n.fencing_token, n.attempt, n.attempt_id,
                       absl::ToInt64Microseconds(*w.lease));
        if (!res.empty()) out = ParseRecord(res[0]);
      });
    } else {
      s = pool_.Run("update", [&](pqxx::connection& c) {
        bool waited = false;
        if (!Distributed()) {
          pqxx::nontransaction tx(c);
          out = ExecUpdate(pool_, tx, w, &waited);
        } else if (!w.audit) {
          pqxx::nontransaction tx(c);
          out = ExecUpdate(pool_, tx, w, &waited, true);
          NotifyIfWaited(tx, w, out, waited);
        } else {
          // The update and its audit row, and the NOTIFY sent at their
          // commit.
          pqxx::work tx(c);
          out = ExecUpdate(pool_, tx, w, &waited, true);
          if (out && waited && Settles(w)) {
            pool_.Exec(tx, "notify", w.next.key.tenant, w.next.key.operation,
                       w.next.key.key);
          }
          tx.commit();
        }
      });
    }
    if (!s.ok()) return s;
    return out;
  }

  // A batch statement failed with `s`: when the connection did (the commit
  // may or may not have happened), every call of it gets UNAVAILABLE, as a
  // single statement's caller would; otherwise one call may be at fault
  // (a constraint, a deadlock with another instance's batch), so each is
  // run on its own.
  template <typename Call, typename One>
  void Fallback(const absl::Status& s, const std::vector<Call*>& batch,
                const One& one) {
    for (Call* call : batch) {
      call->result = s.code() == absl::StatusCode::kUnavailable
                         ? decltype(call->result)(s)
                         : one(call);
    }
  }

  // The statements that serve `batch`: on plain PostgreSQL all of it; on
  // Citus one per shard, so that each is a router query on one worker with
  // a commit in one phase (decision 29). A tenant lies on one shard whatever
  // Citus' layout; tenants whose shard the coordinator has named
  // (TenantShards) fold together, and a tenant whose shard is not known
  // groups alone.
  template <typename Call, typename KeyOf>
  std::vector<std::vector<Call*>> ShardGroups(const std::vector<Call*>& batch,
                                              bool distributed,
                                              const KeyOf& key_of) {
    if (!distributed) return {batch};
    std::map<std::string, std::vector<Call*>> by_tenant;
    for (Call* call : batch) by_tenant[key_of(call).tenant].push_back(call);
    std::vector<std::vector<Call*>> out;
    if (by_tenant.size() == 1) {
      out.push_back(std::move(by_tenant.begin()->second));
      return out;
    }
    std::vector<std::string> unknown;
    for (const auto& [tenant, calls] : by_tenant) {
      if (!shards_.Find(tenant)) unknown.push_back(tenant);
    }
    if (!unknown.empty()) LearnShards(unknown);
    std::map<int64_t, std::vector<Call*>> by_shard;
    for (auto& [tenant, calls] : by_tenant) {
      const std::optional<int64_t> shard = shards_.Find(tenant);
      if (!shard) {
        out.push_back(std::move(calls));
        continue;
      }
      std::vector<Call*>& group = by_shard[*shard];
      group.insert(group.end(), calls.begin(), calls.end());
    }
    for (auto& [shard, calls] : by_shard) out.push_back(std::move(calls));
    return out;
  }

  // Asks the coordinator for the shards of `tenants`; on a failure they
  // group alone until a later batch asks again.
  void LearnShards(const std::vector<std::string>& tenants) {
    std::vector<std::pair<std::string, int64_t>> shards;
    const absl::Status s = pool_.Run("shard_of", [&](pqxx::connection& c) {
      pqxx::nontransaction tx(c);
      shards = ExecShardsOf(tx, tenants);
    });
    if (s.ok()) shards_.Learn(shards);
  }

  // Runs `batch` group by group (ShardGroups): on Citus a group of one call
  // with `one`, its single-row statements; any other group with `run`, which
  // fills the group's results in order and returns the status of its
  // statements. A group whose statements failed runs its calls alone
  // (Fallback).
  template <typename Result, typename Call, typename KeyOf, typename One,
            typename Run>
  void RunGroups(const std::vector<Call*>& batch, const KeyOf& key_of,
                 const One& one, const Run& run) {
    const bool distributed = Distributed();
    for (const std::vector<Call*>& group :
         ShardGroups(batch, distributed, key_of)) {
      if (distributed && group.size() == 1) {
        group[0]->result = one(group[0]);
        continue;
      }
      std::vector<Result> results;
      const absl::Status s = run(group, distributed, &results);
      if (!s.ok()) {
        Fallback(s, group, one);
        continue;
      }
      for (size_t i = 0; i < group.size(); ++i) {
        group[i]->result = std::move(results[i]);
      }
    }
  }

  void FlushReads(const std::vector<ReadCall*>& batch) {
    const auto one = [&](ReadCall* call) { return ReadOne(*call->key); };
    if (batch.size() == 1 && single_rows_) {
      batch[0]->result = one(batch[0]);
      return;
    }
    RunGroups<StoreRead>(
        batch,
        [](const ReadCall* call) -> const RecordKey& { return *call->key; },
        one,
        [&](const std::vector<ReadCall*>& group, bool distributed,
            std::vector<StoreRead>* reads) {
          std::vector<const RecordKey*> keys;
          keys.reserve(group.size());
          for (ReadCall* call : group) keys.push_back(call->key);
          return pool_.Run(distributed ? "read_shard_batch" : "read_batch",
                           [&](pqxx::connection& c) {
                             pqxx::nontransaction tx(c);
                             *reads = distributed
                                          ? ExecReadShardBatch(pool_, tx, keys)
                                          : ExecReadBatch(pool_, tx, keys);
                           });
        });
  }

  // Begin's first step for `batch`: insert-or-read, or, while most Begins
  // find their record (BeginMix), a read first and insert-or-read for the
  // keys it did not find.
  void FlushAcquires(const std::vector<AcquireCall*>& batch) {
    const std::vector<AcquireCall*> rest =
        mix_.ReadFirst() ? ReadExisting(batch) : batch;
    if (!rest.empty()) InsertOrReadCalls(rest);
    size_t existing = 0;
    for (const AcquireCall* call : batch) {
      if (call->result.ok() && call->result->existing) ++existing;
    }
    ObserveMix(existing, batch.size());
  }

  // Feeds BeginMix with `calls` Begins of which `existing` found their
  // record.
  void ObserveMix(size_t existing, size_t calls) {
    if (mix_.Observe(existing, calls)) {
      Log(LogLevel::kInfo,
          mix_.ReadFirst()
              ? "Begin reads first: most Begins find their record"
              : "Begin inserts first: most Begins are for new keys",
          {});
    }
  }

  // Reads the records of `batch`, settles the calls whose record exists or
  // whose read failed, and returns the others.
  std::vector<AcquireCall*> ReadExisting(
      const std::vector<AcquireCall*>& batch) {
    std::vector<ReadCall> reads;
    reads.reserve(batch.size());
    for (AcquireCall* call : batch) {
      reads.push_back(
          ReadCall{&call->write->next.key, absl::UnknownError("not run")});
    }
    std::vector<ReadCall*> calls;
    calls.reserve(reads.size());
    for (ReadCall& read : reads) calls.push_back(&read);
    FlushReads(calls);
    std::vector<AcquireCall*> rest;
    for (size_t i = 0; i < batch.size(); ++i) {
      absl::StatusOr<StoreRead>& read = reads[i].result;
      if (read.ok() && !read->record) {
        rest.push_back(batch[i]);
      } else if (!read.ok()) {
        batch[i]->result = read.status();
      } else {
        InsertOrReadResult found;
        found.existing = *std::move(read);
        batch[i]->result = std::move(found);
      }
    }
    return rest;
  }

  void InsertOrReadCalls(const std::vector<AcquireCall*>& batch) {
    const auto one = [&](AcquireCall* call) {
      return InsertOrReadOne(*call->write);
    };
    if (batch.size() == 1 && single_rows_) {
      batch[0]->result = one(batch[0]);
      return;
    }
    RunGroups<InsertOrReadResult>(
        batch,
        [](const AcquireCall* call) -> const RecordKey& {
          return call->write->next.key;
        },
        one,
        [&](const std::vector<AcquireCall*>& group, bool distributed,
            std::vector<InsertOrReadResult>* found) {
          std::vector<const Write*> writes;
          writes.reserve(group.size());
          for (AcquireCall* call : group) writes.push_back(call->write);
          return distributed
                     ? pool_.Run("insert_or_read_shard_batch",
                                 [&](pqxx::connection& c) {
                                   pqxx::work tx(c);
                                   *found = ExecInsertOrReadShardBatch(
                                       pool_, tx, writes);
                                   tx.commit();
                                 })
                     : pool_.Run(
                           "insert_or_read_batch", [&](pqxx::connection& c) {
                             pqxx::nontransaction tx(c);
                             *found = ExecInsertOrReadBatch(pool_, tx, writes);
                           });
        });
  }

  // Runs `flush` on the calls of `batch`, then each call's completion.
  template <typename Call, typename Fn, typename Flush>
  static void FlushAsync(std::vector<AsyncCall<Call, Fn>>& batch,
                         const Flush& flush) {
    std::vector<Call*> calls;
    calls.reserve(batch.size());
    for (AsyncCall<Call, Fn>& a : batch) {
      a.call.write = &a.write;
      calls.push_back(&a.call);
    }
    flush(calls);
    for (AsyncCall<Call, Fn>& a : batch) a.done(std::move(a.call.result));
  }

  // Two writes of one record cannot share an UPDATE (only one would be
  // applied, and which is undefined): later ones run after the batch, on
  // their own, and see the first one's effect, as if they had come later.
  // Inserts run on their own too.
  void FlushWrites(const std::vector<WriteCall*>& batch) {
    std::vector<WriteCall*> firsts;
    std::vector<WriteCall*> repeats;
    std::set<RecordKey> seen;
    for (WriteCall* call : batch) {
      (call->write->guard && seen.insert(call->write->next.key).second
           ? firsts
           : repeats)
          .push_back(call);
    }
    FlushFirstUpdates(firsts);
    for (WriteCall* call : repeats) call->result = ApplyOne(*call->write);
  }

  // The records that `calls` settled, as written. Their NOTIFY comes too
  // (to every instance), later: this instance's parked Begins are answered
  // from these without waiting for it and reading.
  static std::vector<Record> Settled(const std::vector<WriteCall*>& calls) {
    std::vector<Record> out;
    for (const WriteCall* call : calls) {
      if (call->write->guard && call->result.ok() && *call->result &&
          (*call->result)->status != Status::kProcessing) {
        out.push_back(**call->result);
      }
    }
    return out;
  }

  void FlushFirstUpdates(const std::vector<WriteCall*>& batch) {
    const auto one = [&](WriteCall* call) { return ApplyOne(*call->write); };
    if (batch.size() == 1 && single_rows_) {
      batch[0]->result = one(batch[0]);
      return;
    }
    RunGroups<std::optional<Record>>(
        batch,
        [](const WriteCall* call) -> const RecordKey& {
          return call->write->next.key;
        },
        one,
        [&](const std::vector<WriteCall*>& group, bool distributed,
            std::vector<std::optional<Record>>* written) {
          std::vector<const Write*> writes;
          writes.reserve(group.size());
          for (WriteCall* call : group) writes.push_back(call->write);
          if (!distributed) {
            return pool_.Run("update_batch", [&](pqxx::connection& c) {
              pqxx::nontransaction tx(c);
              *written = ExecUpdateBatch(pool_, tx, writes);
            });
          }
          return pool_.Run("update_shard_batch", [&](pqxx::connection& c) {
            // The updates, their audit rows and the NOTIFYs sent at their
            // commit, as ApplyOne's.
            pqxx::work tx(c);
            std::vector<bool> waited;
            *written = ExecUpdateShardBatch(pool_, tx, writes, &waited);
            for (size_t i = 0; i < writes.size(); ++i) {
              if (!(*written)[i] || !waited[i] || !Settles(*writes[i])) {
                continue;
              }
              const RecordKey& k = writes[i]->next.key;
              pool_.Exec(tx, "notify", k.tenant, k.operation, k.key);
            }
            tx.commit();
          });
        });
  }

  // Whether a batch of one call runs the single-row statement.
  const bool single_rows_;
  // Whether the record table is distributed (Citus), as the newest
  // connection found it.
  std::atomic<bool> distributed_{false};
  std::atomic<bool> layout_known_{false};
  TenantShards shards_;
  PgPool pool_;
  ChangeFeed feed_;
  PgListener listener_;
  BeginMix mix_;
  // Last: their threads stop before the members they use go.
  BatchThreads<AsyncRead> async_reads_;
  BatchThreads<AsyncAcquire> async_acquires_;
  BatchThreads<AsyncUpdate> async_updates_;
  BatchThreads<AsyncCount> counts_;
  BatchThreads<std::function<void()>> admin_;
  // Null when off. Last: its thread, which runs completions that may queue
  // calls for the threads above, stops first.
  std::unique_ptr<PgLane> lane_;
};

}  // namespace

std::unique_ptr<Store> NewPostgresStore(const PgOptions& options,
                                        const PgBatchOptions& batch,
                                        PgStoreProbes* probes) {
  auto store = std::make_unique<PostgresStore>(options, batch);
  if (probes != nullptr) {
    probes->pool_in_use = [s = store.get()] { return s->PoolInUse(); };
    probes->lane_calls = [s = store.get()] { return s->LaneCalls(); };
  }
  return store;
}

}  // namespace idem
