#include "server/postgres/pg_batch.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <numeric>
#include <set>

#include "absl/strings/str_cat.h"
#include "server/postgres/pg_record.h"

namespace idem {
namespace {

// The batch's own columns are named v_*: never a column of the record table.
const std::string& ReadBatchSql() {
  static const std::string* sql = new std::string(absl::StrCat(
      "SELECT ", kRecordColumns,
      ", (extract(epoch FROM now()) * 1000000)::bigint, v.v_i"
      " FROM unnest($1::text[], $2::text[], $3::text[]) WITH ORDINALITY"
      " AS v(v_t, v_o, v_k, v_i) LEFT JOIN idempotency_record r"
      " ON r.tenant_id = v.v_t AND r.operation = v.v_o"
      " AND r.idempotency_key = v.v_k"));
  return *sql;
}

// Marks each PROCESSING record not yet marked as waited on
// (sql/0006_notify_waited.sql) and returns every record with whether it is
// marked. A marked row comes from the UPDATE, which locked its latest
// version: a settle that committed first is seen, one that commits later
// sees the mark and notifies. The others come from the statement's
// snapshot and cost no write: already marked, settled or absent. One
// snapshot row can be stale: PROCESSING and unmarked, because a settle or
// another mark changed it while the UPDATE waited for its lock; the caller
// runs the statement again for those. Marking notifies nothing (not a
// column the trigger watches). The keys go in key order, as the update
// batch's do.
const std::string& ReadForWaiterBatchSql() {
  static const std::string* sql = new std::string(absl::StrCat(
      "WITH v AS (SELECT * FROM unnest($1::text[], $2::text[], $3::text[])"
      " WITH ORDINALITY AS x(v_t, v_o, v_k, v_i)),"
      " m AS (UPDATE idempotency_record r SET waited = true FROM v"
      " WHERE r.tenant_id = v.v_t AND r.operation = v.v_o"
      " AND r.idempotency_key = v.v_k AND r.status = 'PROCESSING'"
      " AND NOT r.waited RETURNING r.*)"
      " SELECT ",
      kRecordColumns,
      ", (extract(epoch FROM now()) * 1000000)::bigint, v.v_i, true"
      " FROM v JOIN m ON m.tenant_id = v.v_t AND m.operation = v.v_o"
      " AND m.idempotency_key = v.v_k"
      " UNION ALL SELECT ",
      kRecordColumns,
      ", (extract(epoch FROM now()) * 1000000)::bigint, v.v_i, r.waited"
      " FROM v LEFT JOIN idempotency_record r ON r.tenant_id = v.v_t"
      " AND r.operation = v.v_o AND r.idempotency_key = v.v_k"
      " WHERE NOT EXISTS (SELECT 1 FROM m WHERE m.tenant_id = v.v_t"
      " AND m.operation = v.v_o AND m.idempotency_key = v.v_k)"));
  return *sql;
}

// Inserted in array order (the caller sorts): an INSERT ... SELECT over
// unnest processes rows in that order. The second branch cannot see rows the
// first inserted (one snapshot), so each key has at most one row.
const std::string& InsertOrReadBatchSql() {
  static const std::string* sql = new std::string(absl::StrCat(
      "WITH v AS (SELECT * FROM unnest($1::text[], $2::text[], $3::text[],"
      " $4::text[], $5::bytea[], $6::bigint[], $7::integer[], $8::text[],"
      " $9::bigint[]) AS x(v_t, v_o, v_k, v_s, v_h, v_f, v_a, v_aid, v_l)),"
      " ins AS (INSERT INTO idempotency_record (tenant_id, operation,"
      " idempotency_key, status, request_hash, fencing_token, attempt,"
      " attempt_id, lease_expires_at) SELECT v_t, v_o, v_k, v_s, v_h, v_f,"
      " v_a, v_aid, now() + v_l * interval '1 microsecond' FROM v"
      " ON CONFLICT (tenant_id, operation, idempotency_key) DO NOTHING"
      " RETURNING *)"
      " SELECT ",
      kRecordColumns,
      ", true, (extract(epoch FROM now()) * 1000000)::bigint FROM ins"
      " UNION ALL SELECT ",
      kRecordColumns,
      ", false, (extract(epoch FROM now()) * 1000000)::bigint FROM v"
      " JOIN idempotency_record r ON r.tenant_id = v.v_t"
      " AND r.operation = v.v_o AND r.idempotency_key = v.v_k"));
  return *sql;
}

// The single-row "update" statement (postgres_store.cc), one row per array
// element; the columns of `v` are its parameters in the same order.
const std::string& UpdateBatchSql() {
  static const std::string* sql = new std::string(absl::StrCat(
      "WITH v AS (SELECT * FROM unnest($1::text[], $2::text[], $3::text[],"
      " $4::text[], $5::bigint[], $6::bool[], $7::text[], $8::bytea[],"
      " $9::bigint[], $10::integer[], $11::text[], $12::bigint[],"
      " $13::bool[], $14::integer[], $15::bytea[], $16::text[],"
      " $17::jsonb[], $18::bool[], $19::bigint[], $20::text[], $21::text[],"
      " $22::text[], $23::text[], $24::text[], $25::text[], $26::bigint[],"
      " $27::bool[], $28::bigint[])"
      " AS x(v_t, v_o, v_k, v_gs, v_gt, v_gl, v_s, v_h, v_f, v_a, v_aid, v_l,"
      " v_hr, v_rc, v_rb, v_rct, v_rh, v_ry, v_ret, v_rby, v_rr, v_af, v_ato,"
      " v_aa, v_ar, v_atok, v_ha, v_tr)),"
      " u AS (UPDATE idempotency_record r SET"
      " status = v.v_s, request_hash = v.v_h, fencing_token = v.v_f,"
      " attempt = v.v_a, attempt_id = v.v_aid,"
      " lease_expires_at = CASE WHEN v.v_l < 0 THEN r.lease_expires_at"
      " ELSE now() + v.v_l * interval '1 microsecond' END,"
      " result_code = CASE WHEN v.v_hr THEN v.v_rc END,"
      " result_body = CASE WHEN v.v_hr THEN v.v_rb END,"
      " result_content_type = CASE WHEN v.v_hr THEN v.v_rct END,"
      " result_headers = CASE WHEN v.v_hr THEN v.v_rh END,"
      " retryable = v.v_ry, updated_at = now(),"
      " expires_at = CASE WHEN v.v_ret < 0 THEN NULL"
      " ELSE now() + v.v_ret * interval '1 microsecond' END,"
      " resolved_by = v.v_rby, resolve_reason = v.v_rr,"
      " tombstone_retention = v.v_tr * interval '1 microsecond',"
      " reconcile_attempts = 0, next_reconcile_at = NULL"
      " FROM v WHERE r.tenant_id = v.v_t AND r.operation = v.v_o"
      " AND r.idempotency_key = v.v_k AND r.status = v.v_gs"
      " AND r.fencing_token = v.v_gt"
      " AND (NOT v.v_gl OR r.lease_expires_at <= now())"
      " RETURNING r.*, v.v_af, v.v_ato, v.v_aa, v.v_ar, v.v_atok, v.v_ha),"
      " a AS (INSERT INTO idempotency_audit (tenant_id, operation,"
      " idempotency_key, from_status, to_status, actor, reason, fencing_token)"
      " SELECT tenant_id, operation, idempotency_key, v_af, v_ato, v_aa, v_ar,"
      " v_atok FROM u WHERE v_ha)"
      " SELECT ",
      kRecordColumns, " FROM u"));
  return *sql;
}

// ReadBatchSql naming the tenants ($4): Citus prunes to their shard.
const std::string& ReadShardBatchSql() {
  static const std::string* sql = new std::string(
      absl::StrCat(ReadBatchSql(), " AND r.tenant_id = ANY($4::text[])"));
  return *sql;
}

// SQL: the time `column` microseconds after now(), or NULL when it is NULL.
// Citus refuses a STABLE function (timestamptz + interval) of a column in
// an UPDATE and any function not IMMUTABLE inside CASE: now() alone it
// replaces by the coordinator's value, to_timestamp is IMMUTABLE.
std::string NowPlusColumn(const char* column) {
  return absl::StrCat("to_timestamp(((extract(epoch FROM now()) * 1000000 + ",
                      column, ") / 1000000)::float8)");
}

// UpdateBatchSql for one shard, without its audit CTE; absent expiries are
// NULL elements. `new_lease`: every write sets a lease (else every write
// keeps its record's).
const std::string& UpdateShardBatchSql(bool new_lease) {
  const auto make = [](bool lease) {
    return new std::string(absl::StrCat(
        "WITH u AS (UPDATE idempotency_record r SET"
        " status = v.v_s, request_hash = v.v_h, fencing_token = v.v_f,"
        " attempt = v.v_a, attempt_id = v.v_aid,",
        lease
            ? absl::StrCat(" lease_expires_at = ", NowPlusColumn("v.v_l"), ",")
            : "",
        " result_code = CASE WHEN v.v_hr THEN v.v_rc END,"
        " result_body = CASE WHEN v.v_hr THEN v.v_rb END,"
        " result_content_type = CASE WHEN v.v_hr THEN v.v_rct END,"
        " result_headers = CASE WHEN v.v_hr THEN v.v_rh END,"
        " retryable = v.v_ry, updated_at = now(),"
        " expires_at = ",
        NowPlusColumn("v.v_ret"),
        ", resolved_by = v.v_rby, resolve_reason = v.v_rr,"
        " tombstone_retention = v.v_tr * interval '1 microsecond',"
        " reconcile_attempts = 0, next_reconcile_at = NULL"
        " FROM unnest($1::text[], $2::text[], $3::text[], $4::text[],"
        " $5::bigint[], $6::bool[], $7::text[], $8::bytea[], $9::bigint[],"
        " $10::integer[], $11::text[], $12::bigint[], $13::bool[],"
        " $14::integer[], $15::bytea[], $16::text[], $17::jsonb[],"
        " $18::bool[], $19::bigint[], $20::text[], $21::text[],"
        " $22::bigint[])"
        " AS v(v_t, v_o, v_k, v_gs, v_gt, v_gl, v_s, v_h, v_f, v_a, v_aid,"
        " v_l, v_hr, v_rc, v_rb, v_rct, v_rh, v_ry, v_ret, v_rby, v_rr, v_tr)"
        " WHERE r.tenant_id = v.v_t AND r.operation = v.v_o"
        " AND r.idempotency_key = v.v_k AND r.tenant_id = ANY($23::text[])"
        " AND r.status = v.v_gs AND r.fencing_token = v.v_gt"
        " AND (NOT v.v_gl OR r.lease_expires_at <= now())"
        " RETURNING r.*) SELECT ",
        kRecordColumns, ", waited FROM u"));
  };
  static const std::string* with_lease = make(true);
  static const std::string* keep_lease = make(false);
  return new_lease ? *with_lease : *keep_lease;
}

// The distinct tenants of `keys`, as an array literal.
std::string TenantsOf(const std::vector<const RecordKey*>& keys) {
  std::set<std::string> tenants;
  for (const RecordKey* k : keys) tenants.insert(k->tenant);
  PgArray out;
  for (const std::string& t : tenants) out.Text(t);
  return out.Finish();
}

// Appends to `sql` a row of VALUES of parameters $first+1 .. $first+count;
// `with_lease`: the last is a lease in microseconds, the row gets now() plus
// it.
void AppendValuesRow(std::string* sql, size_t first, size_t count,
                     bool with_lease) {
  absl::StrAppend(sql, first == 0 ? "(" : ", (");
  const size_t plain = with_lease ? count - 1 : count;
  for (size_t i = 1; i <= plain; ++i) {
    absl::StrAppend(sql, i == 1 ? "$" : ", $", first + i);
  }
  if (with_lease) {
    absl::StrAppend(sql, ", ", NowPlusParam(static_cast<int>(first + count)));
  }
  absl::StrAppend(sql, ")");
}

// Indices of `keys` in key order.
std::vector<size_t> KeyOrder(const std::vector<const RecordKey*>& keys) {
  std::vector<size_t> order(keys.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return *keys[a] < *keys[b]; });
  return order;
}

// Index of each sent key.
std::map<RecordKey, size_t> IndexOf(const std::vector<const RecordKey*>& keys,
                                    const std::vector<bool>& sent) {
  std::map<RecordKey, size_t> index;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (sent[i]) index.emplace(*keys[i], i);
  }
  return index;
}

std::vector<const RecordKey*> KeysOf(const std::vector<const Write*>& writes) {
  std::vector<const RecordKey*> keys;
  keys.reserve(writes.size());
  for (const Write* w : writes) keys.push_back(&w->next.key);
  return keys;
}

}  // namespace

bool BeginMix::Observe(size_t existing, size_t calls) {
  if (calls == 0) return false;
  const int share = static_cast<int>(existing * 1000 / calls);
  // Each batch weighs 1/8: a switch takes a few batches of a new mix.
  const int avg = permille_.load(std::memory_order_relaxed);
  const int next = avg + (share - avg) / 8;
  permille_.store(next, std::memory_order_relaxed);
  const bool was = read_first_.load(std::memory_order_relaxed);
  const bool now = was ? next >= 500 : next >= 800;
  if (now == was) return false;
  read_first_.store(now, std::memory_order_relaxed);
  return true;
}

void PgArray::Separator() {
  if (out_.size() > 1) out_.push_back(',');
}

void PgArray::Text(const std::string& s) {
  Separator();
  out_.push_back('"');
  for (char c : s) {
    if (c == '"' || c == '\\') out_.push_back('\\');
    out_.push_back(c);
  }
  out_.push_back('"');
}

void PgArray::Bytes(const std::string& s) {
  static constexpr char kHex[] = "0123456789abcdef";
  Separator();
  // The element is bytea's hex input \x...; the backslash escaped.
  out_ += "\"\\\\x";
  for (unsigned char c : s) {
    out_.push_back(kHex[c >> 4]);
    out_.push_back(kHex[c & 0xf]);
  }
  out_.push_back('"');
}

void PgArray::Int(int64_t v) {
  Separator();
  out_ += absl::StrCat(v);
}

void PgArray::Bool(bool v) {
  Separator();
  out_.push_back(v ? 't' : 'f');
}

void PgArray::Null() {
  Separator();
  out_ += "NULL";
}

std::string PgArray::Finish() {
  out_.push_back('}');
  return std::move(out_);
}

std::vector<std::pair<std::string, std::string>> BatchStatements() {
  return {{"read_batch", ReadBatchSql()},
          {"read_for_waiter_batch", ReadForWaiterBatchSql()},
          {"insert_or_read_batch", InsertOrReadBatchSql()},
          {"update_batch", UpdateBatchSql()},
          {"read_shard_batch", ReadShardBatchSql()},
          {"update_shard_batch_lease", UpdateShardBatchSql(true)},
          {"update_shard_batch", UpdateShardBatchSql(false)}};
}

// The batch read of `keys`; `one_shard` (Citus): the statement also names
// their tenants, so that Citus routes it to their one shard.
static std::vector<StoreRead> ReadKeys(
    const PgPool& pool, pqxx::transaction_base& tx,
    const std::vector<const RecordKey*>& keys, bool one_shard) {
  PgArray tenants, operations, ids;
  for (const RecordKey* k : keys) {
    tenants.Text(k->tenant);
    operations.Text(k->operation);
    ids.Text(k->key);
  }
  pqxx::result res =
      one_shard ? pool.Exec(tx, "read_shard_batch", tenants.Finish(),
                            operations.Finish(), ids.Finish(), TenantsOf(keys))
                : pool.Exec(tx, "read_batch", tenants.Finish(),
                            operations.Finish(), ids.Finish());
  std::vector<StoreRead> out(keys.size());
  for (const pqxx::row& row : res) {
    const size_t i = row[kRecordColumnCount + 1].as<size_t>() - 1;
    if (i >= out.size()) continue;
    out[i].now = FromMicros(row[kRecordColumnCount]);
    if (!row[0].is_null()) out[i].record = ParseRecord(row);
  }
  return out;
}

std::vector<StoreRead> ExecReadBatch(
    const PgPool& pool, pqxx::transaction_base& tx,
    const std::vector<const RecordKey*>& keys) {
  return ReadKeys(pool, tx, keys, /*one_shard=*/false);
}

std::vector<StoreRead> ExecReadForWaiterBatch(
    const PgPool& pool, pqxx::transaction_base& tx,
    const std::vector<const RecordKey*>& keys) {
  // Enough for any plausible race; past it the stale read stands and the
  // waiters' lease timer wakes them.
  constexpr int kPasses = 4;
  std::vector<StoreRead> out(keys.size());
  std::vector<size_t> pending(keys.size());
  std::iota(pending.begin(), pending.end(), 0);
  for (int pass = 0; pass < kPasses && !pending.empty(); ++pass) {
    std::vector<const RecordKey*> sub;
    sub.reserve(pending.size());
    for (size_t i : pending) sub.push_back(keys[i]);
    const std::vector<size_t> order = KeyOrder(sub);
    PgArray tenants, operations, ids;
    for (size_t i : order) {
      tenants.Text(sub[i]->tenant);
      operations.Text(sub[i]->operation);
      ids.Text(sub[i]->key);
    }
    pqxx::result res = pool.Exec(tx, "read_for_waiter_batch", tenants.Finish(),
                                 operations.Finish(), ids.Finish());
    std::vector<size_t> stale;
    for (const pqxx::row& row : res) {
      const size_t sent = row[kRecordColumnCount + 1].as<size_t>() - 1;
      if (sent >= order.size()) continue;
      const size_t i = pending[order[sent]];
      StoreRead& read = out[i];
      read.now = FromMicros(row[kRecordColumnCount]);
      read.record.reset();
      if (row[0].is_null()) continue;
      read.record = ParseRecord(row);
      if (read.record->status == Status::kProcessing &&
          !row[kRecordColumnCount + 2].as<bool>()) {
        stale.push_back(i);
      }
    }
    // Each statement has a snapshot of its own (autocommit or READ
    // COMMITTED): the next pass sees what changed the stale rows.
    pending = std::move(stale);
  }
  return out;
}

std::vector<InsertOrReadResult> ExecInsertOrReadBatch(
    const PgPool& pool, pqxx::transaction_base& tx,
    const std::vector<const Write*>& writes) {
  const std::vector<const RecordKey*> keys = KeysOf(writes);
  std::vector<bool> sent(writes.size(), false);
  PgArray t, o, k, s, h, f, a, aid, l;
  const RecordKey* last = nullptr;
  for (size_t i : KeyOrder(keys)) {
    if (last != nullptr && *last == *keys[i]) continue;
    last = keys[i];
    sent[i] = true;
    const Record& n = writes[i]->next;
    t.Text(n.key.tenant);
    o.Text(n.key.operation);
    k.Text(n.key.key);
    s.Text(StatusName(n.status));
    h.Bytes(n.request_hash);
    f.Int(n.fencing_token);
    a.Int(n.attempt);
    aid.Text(n.attempt_id);
    l.Int(MicrosOrMinus(writes[i]->lease));
  }
  pqxx::result res = pool.Exec(
      tx, "insert_or_read_batch", t.Finish(), o.Finish(), k.Finish(),
      s.Finish(), h.Finish(), f.Finish(), a.Finish(), aid.Finish(), l.Finish());
  const std::map<RecordKey, size_t> index = IndexOf(keys, sent);
  std::vector<InsertOrReadResult> out(writes.size());
  for (const pqxx::row& row : res) {
    Record r = ParseRecord(row);
    auto it = index.find(r.key);
    if (it == index.end()) continue;
    if (row[kRecordColumnCount].as<bool>()) {
      out[it->second].created = std::move(r);
    } else {
      out[it->second].existing =
          StoreRead{std::move(r), FromMicros(row[kRecordColumnCount + 1])};
    }
  }
  return out;
}

// The arrays of the guarded update's parameters $1 to $21, an element per
// write: the row's key, its guard and what to write. The batch update of one
// PostgreSQL and that of one Citus shard both start with them.
struct GuardedUpdateArrays {
  PgArray t, o, k, gs, gt, gl, s, h, f, a, aid, l, hr, rc, rb, rct, rh, ry, ret,
      rby, rr;

  // `null_retention`: a write that keeps the retention sends NULL, not -1.
  void Add(const Write& w, bool null_retention) {
    static const Snapshot* const empty = new Snapshot();
    const Record& n = w.next;
    const Snapshot& result = n.result ? *n.result : *empty;
    t.Text(n.key.tenant);
    o.Text(n.key.operation);
    k.Text(n.key.key);
    gs.Text(StatusName(w.guard->status));
    gt.Int(w.guard->fencing_token);
    gl.Bool(w.guard->lease_expired);
    s.Text(StatusName(n.status));
    h.Bytes(n.request_hash);
    f.Int(n.fencing_token);
    a.Int(n.attempt);
    aid.Text(n.attempt_id);
    l.Int(MicrosOrMinus(w.lease));
    hr.Bool(n.result.has_value());
    rc.Int(result.code);
    rb.Bytes(result.body);
    rct.Text(result.content_type);
    rh.Text(HeadersJson(result.headers));
    ry.Bool(n.retryable);
    if (null_retention && !w.retention) {
      ret.Null();
    } else {
      ret.Int(MicrosOrMinus(w.retention));
    }
    rby.Text(n.resolved_by);
    rr.Text(n.resolve_reason);
  }

  std::vector<std::string> Finish() {
    std::vector<std::string> out;
    out.reserve(21);
    for (PgArray* x : {&t, &o,  &k,  &gs, &gt,  &gl, &s,  &h,   &f,   &a, &aid,
                       &l, &hr, &rc, &rb, &rct, &rh, &ry, &ret, &rby, &rr}) {
      out.push_back(x->Finish());
    }
    return out;
  }
};

std::vector<std::optional<Record>> ExecUpdateBatch(
    const PgPool& pool, pqxx::transaction_base& tx,
    const std::vector<const Write*>& writes) {
  const std::vector<const RecordKey*> keys = KeysOf(writes);
  GuardedUpdateArrays u;
  PgArray af, ato, aa, ar, atok, ha, tr;
  const AuditEntry no_audit;
  for (size_t i : KeyOrder(keys)) {
    const Write& w = *writes[i];
    const AuditEntry& audit = w.audit ? *w.audit : no_audit;
    u.Add(w, /*null_retention=*/false);
    af.Text(StatusName(audit.from));
    ato.Text(StatusName(audit.to));
    aa.Text(audit.actor);
    ar.Text(audit.reason);
    atok.Int(audit.fencing_token);
    ha.Bool(w.audit.has_value());
    tr.Int(absl::ToInt64Microseconds(w.tombstone_retention));
  }
  std::vector<std::string> params = u.Finish();
  for (PgArray* extra : {&af, &ato, &aa, &ar, &atok, &ha, &tr}) {
    params.push_back(extra->Finish());
  }
  pqxx::result res =
      pool.Exec(tx, "update_batch", pqxx::prepare::make_dynamic_params(params));
  const std::map<RecordKey, size_t> index =
      IndexOf(keys, std::vector<bool>(writes.size(), true));
  std::vector<std::optional<Record>> out(writes.size());
  for (const pqxx::row& row : res) {
    Record r = ParseRecord(row);
    auto it = index.find(r.key);
    if (it != index.end()) out[it->second] = std::move(r);
  }
  return out;
}

std::vector<StoreRead> ExecReadShardBatch(
    const PgPool& pool, pqxx::transaction_base& tx,
    const std::vector<const RecordKey*>& keys) {
  return ReadKeys(pool, tx, keys, /*one_shard=*/true);
}

std::optional<int64_t> TenantShards::Find(const std::string& tenant) {
  absl::MutexLock lock(&mu_);
  if (absl::Now() - filled_ > kForgetAfter) {
    shards_.clear();
    return std::nullopt;
  }
  auto it = shards_.find(tenant);
  if (it == shards_.end()) return std::nullopt;
  return it->second;
}

void TenantShards::Learn(
    const std::vector<std::pair<std::string, int64_t>>& shards) {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  if (shards_.empty() || now - filled_ > kForgetAfter ||
      shards_.size() + shards.size() > kMaxTenants) {
    shards_.clear();
    filled_ = now;
  }
  for (const auto& [tenant, shard] : shards) shards_[tenant] = shard;
}

std::vector<std::pair<std::string, int64_t>> ExecShardsOf(
    pqxx::transaction_base& tx, const std::vector<std::string>& tenants) {
  PgArray array;
  for (const std::string& t : tenants) array.Text(t);
  // Unnamed: it runs once per new tenant, and only on Citus.
  pqxx::result res = tx.exec_params(
      "SELECT t, get_shard_id_for_distribution_column("
      "'idempotency_record'::regclass, t) FROM unnest($1::text[]) AS t",
      array.Finish());
  std::vector<std::pair<std::string, int64_t>> out;
  out.reserve(res.size());
  for (const pqxx::row& row : res) {
    out.emplace_back(row[0].as<std::string>(), row[1].as<int64_t>());
  }
  return out;
}

std::vector<InsertOrReadResult> ExecInsertOrReadShardBatch(
    const PgPool& pool, pqxx::transaction_base& tx,
    const std::vector<const Write*>& writes) {
  // Citus routes a multi-row INSERT ... VALUES whose rows are on one shard,
  // but not an INSERT ... SELECT from arrays, nor a RETURNING that calls a
  // function not IMMUTABLE: the insert returns the keys it created, and the
  // read that follows, in the same transaction, the records.
  constexpr size_t kColumns = 9;
  const std::vector<const RecordKey*> keys = KeysOf(writes);
  std::vector<size_t> sent;
  std::vector<const RecordKey*> sent_keys;
  std::vector<std::string> params;
  std::string sql =
      "INSERT INTO idempotency_record (tenant_id, operation, idempotency_key,"
      " status, request_hash, fencing_token, attempt, attempt_id,"
      " lease_expires_at) VALUES ";
  const RecordKey* last = nullptr;
  for (size_t i : KeyOrder(keys)) {
    if (last != nullptr && *last == *keys[i]) continue;
    last = keys[i];
    sent.push_back(i);
    sent_keys.push_back(keys[i]);
    const Write& w = *writes[i];
    const Record& n = w.next;
    AppendValuesRow(&sql, params.size(), kColumns, true);
    params.push_back(n.key.tenant);
    params.push_back(n.key.operation);
    params.push_back(n.key.key);
    params.emplace_back(StatusName(n.status));
    params.push_back(ByteaText(n.request_hash));
    params.push_back(absl::StrCat(n.fencing_token));
    params.push_back(absl::StrCat(n.attempt));
    params.push_back(n.attempt_id);
    params.push_back(absl::StrCat(MicrosOrMinus(w.lease)));
  }
  sql +=
      " ON CONFLICT (tenant_id, operation, idempotency_key) DO NOTHING"
      " RETURNING tenant_id, operation, idempotency_key";
  std::set<RecordKey> created;
  for (const pqxx::row& row :
       tx.exec_params(sql, pqxx::prepare::make_dynamic_params(params))) {
    created.insert(RecordKey{row[0].c_str(), row[1].c_str(), row[2].c_str()});
  }
  std::vector<StoreRead> reads = ExecReadShardBatch(pool, tx, sent_keys);
  std::vector<InsertOrReadResult> out(writes.size());
  for (size_t j = 0; j < sent.size(); ++j) {
    if (!reads[j].record) continue;
    InsertOrReadResult& result = out[sent[j]];
    if (created.count(*sent_keys[j]) != 0) {
      result.created = std::move(reads[j].record);
    } else {
      result.existing = std::move(reads[j]);
    }
  }
  return out;
}

std::vector<std::optional<Record>> ExecUpdateShardBatch(
    const PgPool& pool, pqxx::transaction_base& tx,
    const std::vector<const Write*>& writes, std::vector<bool>* waited) {
  const std::vector<const RecordKey*> keys = KeysOf(writes);
  const std::map<RecordKey, size_t> index =
      IndexOf(keys, std::vector<bool>(writes.size(), true));
  std::vector<std::optional<Record>> out(writes.size());
  waited->assign(writes.size(), false);
  const std::vector<size_t> order = KeyOrder(keys);
  // Citus refuses now() inside CASE: writes that set a lease and writes
  // that keep theirs are two statements.
  for (const bool new_lease : {true, false}) {
    GuardedUpdateArrays u;
    PgArray tr;
    std::vector<const RecordKey*> sent;
    for (size_t i : order) {
      const Write& w = *writes[i];
      if (w.lease.has_value() != new_lease) continue;
      sent.push_back(keys[i]);
      u.Add(w, /*null_retention=*/true);
      tr.Int(absl::ToInt64Microseconds(w.tombstone_retention));
    }
    if (sent.empty()) continue;
    std::vector<std::string> params = u.Finish();
    params.push_back(tr.Finish());
    params.push_back(TenantsOf(sent));
    pqxx::result res = pool.Exec(
        tx, new_lease ? "update_shard_batch_lease" : "update_shard_batch",
        pqxx::prepare::make_dynamic_params(params));
    for (const pqxx::row& row : res) {
      Record r = ParseRecord(row);
      auto it = index.find(r.key);
      if (it == index.end()) continue;
      (*waited)[it->second] = row[kRecordColumnCount].as<bool>();
      out[it->second] = std::move(r);
    }
  }
  // The audit rows of the writes whose guard held, in key order.
  constexpr size_t kColumns = 8;
  std::vector<std::string> params;
  std::string sql =
      "INSERT INTO idempotency_audit (tenant_id, operation, idempotency_key,"
      " from_status, to_status, actor, reason, fencing_token) VALUES ";
  for (size_t i : order) {
    const Write& w = *writes[i];
    if (!w.audit || !out[i]) continue;
    AppendValuesRow(&sql, params.size(), kColumns, false);
    params.push_back(w.next.key.tenant);
    params.push_back(w.next.key.operation);
    params.push_back(w.next.key.key);
    params.emplace_back(StatusName(w.audit->from));
    params.emplace_back(StatusName(w.audit->to));
    params.push_back(w.audit->actor);
    params.push_back(w.audit->reason);
    params.push_back(absl::StrCat(w.audit->fencing_token));
  }
  if (!params.empty()) {
    tx.exec_params(sql, pqxx::prepare::make_dynamic_params(params));
  }
  return out;
}

}  // namespace idem
