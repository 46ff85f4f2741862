// Statements that read, create or change many records in one round trip and
// one commit: the rows travel as arrays (unnest), each statement is prepared,
// and every row gets exactly what its single-row statement would have given.
// The PostgreSQL store folds concurrent calls into them (group_commit.h).
#ifndef IDEM_SERVER_POSTGRES_PG_BATCH_H_
#define IDEM_SERVER_POSTGRES_PG_BATCH_H_

#include <atomic>
#include <cstdint>
#include <optional>
#include <pqxx/pqxx>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/postgres/pg_pool.h"
#include "server/store/store.h"
#include "statemachine/record.h"
#include "statemachine/transitions.h"

namespace idem {

// How the PostgreSQL store folds concurrent calls into batch statements.
struct PgBatchOptions {
  // Most calls one statement carries; 1 turns batching off.
  int max_batch = 64;
  // Batches of one kind (reads, inserts, updates) in flight at once.
  int inflight = 1;
  // Tests: use the batch statements even for a batch of one call.
  bool always = false;
  // A call with nothing else in flight takes the lone-call lane, one more
  // connection (pg_lane.h); off with `always`.
  bool lone_lane = true;
};

// Which statement Begin's first step starts with. Insert-or-read settles a
// new key and a replay in one round trip, but for a key that exists it is
// an insert that conflicts and then a read: PostgreSQL spends about 1.4
// times what a plain read costs (pgbench, batches of existing keys). So while
// most recent Begins found their record (replays, a retry storm), the store
// reads first and runs insert-or-read only for the keys the read did not
// find; once new keys dominate again it inserts first. Either way each
// call gets the same answer; only the cost moves. The share of existing
// keys is a moving average over batches, with hysteresis (read first from
// 80%, insert first again below 50%) so the mode does not flap. With
// batching off (--pg-max-batch 1) Begin always inserts first.
// Thread-safe (races between batches only blur the average).
class BeginMix {
 public:
  // Whether to read first.
  bool ReadFirst() const { return read_first_.load(std::memory_order_relaxed); }
  // A batch of `calls` Begins found `existing` records. Returns true when
  // the mode changed.
  bool Observe(size_t existing, size_t calls);

 private:
  // Moving average of the existing share, in 1/1000.
  std::atomic<int> permille_{0};
  std::atomic<bool> read_first_{false};
};

// (name, SQL) of the batch statements, for PgPool::Prepare.
std::vector<std::pair<std::string, std::string>> BatchStatements();

// Reads every key of `keys` (duplicates allowed) and the store's clock.
// Returns one read per key, in order.
std::vector<StoreRead> ExecReadBatch(const PgPool& pool,
                                     pqxx::transaction_base& tx,
                                     const std::vector<const RecordKey*>& keys);

// ExecReadBatch for parked Begins: marks each PROCESSING record as waited on
// first (once: a marked or settled record is only read), so that its
// settle notifies (sql/0006_notify_waited.sql), and returns the records as
// marked; a settle that committed before the mark is in them. Duplicates
// allowed. Returns one read per key, in order. `tx` must give each
// statement its own snapshot (autocommit or READ COMMITTED).
std::vector<StoreRead> ExecReadForWaiterBatch(
    const PgPool& pool, pqxx::transaction_base& tx,
    const std::vector<const RecordKey*>& keys);

// Begin's first step for many records: inserts the unguarded writes (new
// PROCESSING records) with ON CONFLICT DO NOTHING, in key order so that
// concurrent batches cannot deadlock, and reads the records they ran into.
// Returns one result per write, in order (see InsertOrReadResult; a write
// whose key an earlier write of the batch had gets neither).
std::vector<InsertOrReadResult> ExecInsertOrReadBatch(
    const PgPool& pool, pqxx::transaction_base& tx,
    const std::vector<const Write*>& writes);

// Applies guarded writes, with their audit rows, in key order. No two may
// name the same record. Returns, per write in order, the record as written,
// or nullopt when its guard did not hold.
std::vector<std::optional<Record>> ExecUpdateBatch(
    const PgPool& pool, pqxx::transaction_base& tx,
    const std::vector<const Write*>& writes);

// The batch statements for a distributed table (Citus, decision 29): the
// records of a batch all lie on one shard, `tenants` lists their distinct
// tenants (the statements name them, so that Citus routes each statement
// to that shard's worker whole), and no statement feeds a data-modifying
// CTE into another or calls a STABLE function of a column. Rows on several
// shards still get the right answer, from a statement Citus may refuse
// (SQLSTATE 0A000) or run through the coordinator.

// ExecReadBatch on one shard.
std::vector<StoreRead> ExecReadShardBatch(
    const PgPool& pool, pqxx::transaction_base& tx,
    const std::vector<const RecordKey*>& keys);

// ExecInsertOrReadBatch on one shard: a multi-row INSERT ... VALUES, then a
// read of every key. `tx` must be a transaction (the read sees the rows the
// insert created as created). Same results as ExecInsertOrReadBatch.
std::vector<InsertOrReadResult> ExecInsertOrReadShardBatch(
    const PgPool& pool, pqxx::transaction_base& tx,
    const std::vector<const Write*>& writes);

// ExecUpdateBatch on one shard: an UPDATE per kind of write (with a new
// lease or keeping the lease), then one multi-row INSERT of the audit rows.
// `tx` must be a transaction. `waited` gets, per write, whether a Begin
// waits on the record written.
std::vector<std::optional<Record>> ExecUpdateShardBatch(
    const PgPool& pool, pqxx::transaction_base& tx,
    const std::vector<const Write*>& writes, std::vector<bool>* waited);

// On Citus, the shard that holds each tenant's records, as the coordinator
// computes it (get_shard_id_for_distribution_column), learnt on first sight,
// so that the tenants of a batch that share a shard fold into one router
// statement (decision 29). Forgotten kForgetAfter after it was first filled,
// so that a split shard is seen: until then a group may span two shards,
// which Citus still runs correctly, only not as a router query. Holds at most
// kMaxTenants tenants (then starts again). Thread-safe.
class TenantShards {
 public:
  static constexpr size_t kMaxTenants = 65536;
  static constexpr absl::Duration kForgetAfter = absl::Minutes(1);

  // The shard of `tenant`, if known.
  std::optional<int64_t> Find(const std::string& tenant);
  void Learn(const std::vector<std::pair<std::string, int64_t>>& shards);

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, int64_t> shards_ ABSL_GUARDED_BY(mu_);
  absl::Time filled_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

// The shard of each of `tenants` on the Citus coordinator of `tx` (one
// statement).
std::vector<std::pair<std::string, int64_t>> ExecShardsOf(
    pqxx::transaction_base& tx, const std::vector<std::string>& tenants);

// Builds the text of a PostgreSQL array literal ('{"a","b"}'), for binding
// an array parameter. Exposed for tests.
class PgArray {
 public:
  void Text(const std::string& s);
  void Bytes(const std::string& s);
  void Int(int64_t v);
  void Bool(bool v);
  void Null();
  std::string Finish();

 private:
  void Separator();
  std::string out_ = "{";
};

}  // namespace idem

#endif  // IDEM_SERVER_POSTGRES_PG_BATCH_H_
