// The storage interfaces behind the coordinator, the services and the
// background loops. Backing stores: PostgreSQL (the source of truth) and
// memory (unit tests and --store=memory); caches of terminal records (Redis,
// in-process) decorate the records. All methods are thread-safe.
#ifndef IDEM_SERVER_STORE_STORE_H_
#define IDEM_SERVER_STORE_STORE_H_

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/store/change_feed.h"
#include "server/store/store_stats.h"
#include "statemachine/record.h"
#include "statemachine/transitions.h"

namespace idem {

// A record (absent: nullopt) read together with the store's clock.
struct StoreRead {
  std::optional<Record> record;
  absl::Time now;
};

// Where a listing continues: after this record in (updated_at, key) order.
struct ListCursor {
  absl::Time updated_at;
  RecordKey key;
};

// A record answered by a cache in front of the store.
struct CachedRecord {
  // Shared with the cache (never null): a hit costs a reference count, not
  // a copy of the record and its result.
  std::shared_ptr<const Record> record;
  // How much longer the cache may keep serving it (at most until its
  // expires_at).
  absl::Duration ttl;
  // Which cache answered: "memory" or "redis" (idem_replay_total{source}).
  const char* source;
};

// What InsertOrRead found: the record it created, or the one that exists.
// Neither: a record exists that the statement could not see (created by a
// transaction that committed after the statement began); read it.
struct InsertOrReadResult {
  std::optional<Record> created;
  std::optional<StoreRead> existing;
};

// Filters of a listing; empty strings and unset fields match everything.
struct ListQuery {
  std::string tenant;
  std::string operation;
  std::optional<Status> status;
  // Only records whose updated_at is at least this long before now.
  absl::Duration older_than = absl::ZeroDuration();
  int limit = 100;
  // With max_bytes > 0, a listing also ends one record after the first
  // whose ResultBytes bring the sum to max_bytes or more (so that the
  // caller sees whether more follow): its memory stays near max_bytes
  // however large the results are.
  size_t max_bytes = 0;
  std::optional<ListCursor> after;
};

// One page of a record's audit entries.
struct HistoryQuery {
  RecordKey key;
  // Only entries whose AuditEntry::id is larger.
  int64_t after_id = 0;
  int limit = 100;
};

// The bytes of a record's result as --max-snapshot-bytes counts them (body,
// content type, header names and values); 0 without one.
inline size_t ResultBytes(const Record& r) {
  if (!r.result) return 0;
  size_t n = r.result->body.size() + r.result->content_type.size();
  for (const auto& [name, value] : r.result->headers) {
    n += name.size() + value.size();
  }
  return n;
}

// An UNKNOWN record claimed for a reconciliation probe.
struct ReconcileClaim {
  Record record;
  int attempt = 0;  // 1 for the first probe
};

// Decides the expiry write for one record whose lease ran out.
using ExpireFn = std::function<Decision(const Record&, absl::Time now)>;

// Errors: UNAVAILABLE when the store cannot be reached or did not answer in
// time (the caller may retry the same call); INTERNAL for anything else.
//
// The store is split by who uses it: the coordinator the records
// (RecordStore, which caches decorate), the admin service and health the
// admin queries (AdminStore), the background loops maintenance
// (MaintenanceStore), parked Begins the change feed. Store is a backing
// store (PostgreSQL, memory) that is all of them.

// The coordinator's calls. They never block their caller: each answers
// through `done` exactly once, at once on the caller's thread or later on a
// thread of the store's own, and `done` must not block. Their arguments
// need to live only until the call returns.
class RecordStore {
 public:
  virtual ~RecordStore() = default;

  using ReadFn = std::function<void(absl::StatusOr<StoreRead>)>;
  using InsertOrReadFn =
      std::function<void(absl::StatusOr<InsertOrReadResult>)>;
  using ApplyFn = std::function<void(absl::StatusOr<std::optional<Record>>)>;
  using CountFn = std::function<void(absl::StatusOr<int64_t>)>;

  // Reads the record named by `key` and the store's current time.
  virtual void Read(const RecordKey& key, ReadFn done) = 0;

  // Read for a parked Begin: first marks the record as waited on, so that
  // its settling is published on the change feed (Store::Changes), then
  // answers the record as of the mark. A settle that the answer does not
  // show is published. This default is Read, for a store whose feed
  // publishes every change.
  virtual void ReadForWaiter(const RecordKey& key, ReadFn done) {
    Read(key, std::move(done));
  }

  // Applies `write` atomically if its guard still holds (without a guard: if
  // the record does not exist yet), with the store's clock as "now", and
  // writes its audit row in the same transaction. Answers the record as
  // written, or nullopt when the guard did not hold (read again and decide
  // again). An acknowledged write is durable.
  virtual void Apply(const Write& write, ApplyFn done) = 0;

  // Applies the unguarded `write` (creates its PROCESSING record) unless a
  // record has its key, and otherwise reads that record, in one round trip
  // where the store can: Begin's first step. This default runs Apply, then
  // Read.
  virtual void InsertOrRead(const Write& write, InsertOrReadFn done);

  // The number of `tenant`'s PROCESSING records.
  virtual void CountProcessing(const std::string& tenant, CountFn done) = 0;

  // Looks `key` up in a cache in front of the store, never in the store
  // itself, on the caller's thread. Returns a terminal record that will not
  // change any more, or nullopt: no cache, a miss, or a cache that could
  // not answer (never read as "the record is absent": the caller then asks
  // the store).
  virtual std::optional<CachedRecord> ReadCached(const RecordKey& /*key*/) {
    return std::nullopt;
  }

  // ReadCached for many keys at once: a remote cache answers them all with
  // one pipelined round trip. result[i] answers *keys[i]. This default asks
  // ReadCached for each.
  virtual std::vector<std::optional<CachedRecord>> ReadCachedMany(
      const std::vector<const RecordKey*>& keys) {
    std::vector<std::optional<CachedRecord>> out;
    out.reserve(keys.size());
    for (const RecordKey* key : keys) out.push_back(ReadCached(*key));
    return out;
  }

  // The records of `keys` were purged (MaintenanceStore::Purge): caches
  // drop them. Blocking; for the purge loop's thread.
  virtual void Forget(const std::vector<RecordKey>& /*keys*/) {}
};

// The admin service's queries, answered with completions like the record
// calls (`done` exactly once, from any thread, maybe inline), and health's
// ping, blocking (for the health monitor's own thread).
class AdminStore {
 public:
  using HistoryFn =
      std::function<void(absl::StatusOr<std::vector<AuditEntry>>)>;
  using ListFn = std::function<void(absl::StatusOr<std::vector<Record>>)>;

  virtual ~AdminStore() = default;

  // Returns OK when the store answers.
  virtual absl::Status Ping() = 0;

  // Up to query.limit audit entries of one record after query.after_id,
  // oldest first.
  virtual void History(const HistoryQuery& query, HistoryFn done) = 0;

  // Up to query.limit records matching `query` (and no more than
  // query.max_bytes allows), ordered by (updated_at, tenant, operation,
  // key), oldest first. A record that changes while a
  // listing pages through may appear again with its new state; none is
  // skipped.
  virtual void List(const ListQuery& query, ListFn done) = 0;
};

// The background loops' work (maintenance.h, reconciler.h). Blocking, and
// safe to run on many instances at once.
class MaintenanceStore {
 public:
  virtual ~MaintenanceStore() = default;

  // Applies `expire`'s writes to up to `limit` PROCESSING records whose lease
  // ran out by the store's clock, each with its audit row. Records another
  // instance is working on are skipped, so many reapers may run at once.
  // Returns the records as written.
  virtual absl::StatusOr<std::vector<Record>> ExpireLeases(
      int limit, const ExpireFn& expire) = 0;

  // Up to `limit` terminal records whose expires_at has passed, never
  // PROCESSING or UNKNOWN ones, become tombstones (result dropped, kept for
  // their tombstone_retention more) or, when they leave none or already are
  // one, are deleted. Returns the keys changed.
  virtual absl::StatusOr<std::vector<RecordKey>> Purge(int limit) = 0;

  // Record counts by status and the oldest UNKNOWN record's age.
  virtual absl::StatusOr<StoreStats> Stats() = 0;

  // Claims up to `limit` UNKNOWN records of the operations in
  // `max_attempts` (operation -> attempts allowed) that are due for a probe,
  // counting the attempt and postponing the next one by `backoff` doubled
  // per earlier attempt (at most `max_backoff`). A claimed record is not
  // claimed again before its next attempt is due.
  virtual absl::StatusOr<std::vector<ReconcileClaim>> ClaimUnknown(
      const std::map<std::string, int>& max_attempts, absl::Duration backoff,
      absl::Duration max_backoff, int limit) = 0;
};

// A backing store: records, admin queries, maintenance and the change feed
// of one database.
class Store : public RecordStore, public AdminStore, public MaintenanceStore {
 public:
  // The feed of this store's record changes, made by any instance (see
  // change_feed.h): a change to a state other than PROCESSING of a record
  // that ReadForWaiter marked is published once reads see it (a store may
  // publish more). Lives as long as the store.
  virtual ChangeFeed* Changes() = 0;
};

// The one forwarding of the record calls: every RecordStore method of
// `Interface` (RecordStore or Store) goes to `target`. The decorators below
// derive from it and override only what they change, the leveldb
// EnvWrapper way.
template <typename Interface>
class ForwardingRecords : public Interface {
 public:
  using ReadFn = RecordStore::ReadFn;
  using InsertOrReadFn = RecordStore::InsertOrReadFn;
  using ApplyFn = RecordStore::ApplyFn;
  using CountFn = RecordStore::CountFn;

  void Read(const RecordKey& key, ReadFn done) override {
    target_->Read(key, std::move(done));
  }
  void ReadForWaiter(const RecordKey& key, ReadFn done) override {
    target_->ReadForWaiter(key, std::move(done));
  }
  void Apply(const Write& write, ApplyFn done) override {
    target_->Apply(write, std::move(done));
  }
  void InsertOrRead(const Write& write, InsertOrReadFn done) override {
    target_->InsertOrRead(write, std::move(done));
  }
  void CountProcessing(const std::string& tenant, CountFn done) override {
    target_->CountProcessing(tenant, std::move(done));
  }
  std::optional<CachedRecord> ReadCached(const RecordKey& key) override {
    return target_->ReadCached(key);
  }
  std::vector<std::optional<CachedRecord>> ReadCachedMany(
      const std::vector<const RecordKey*>& keys) override {
    return target_->ReadCachedMany(keys);
  }
  void Forget(const std::vector<RecordKey>& keys) override {
    target_->Forget(keys);
  }

 protected:
  explicit ForwardingRecords(Interface* target) : target_(target) {}
  Interface* target() { return target_; }

 private:
  Interface* const target_;
};

// A RecordStore over another, not owned (the caches, test fakes of the
// records): `base` must outlive it.
class RecordStoreWrapper : public ForwardingRecords<RecordStore> {
 public:
  explicit RecordStoreWrapper(RecordStore* base) : ForwardingRecords(base) {}

 protected:
  RecordStore* base() { return target(); }
};

// A Store over another, owned (instrumentation, test fakes of a backing
// store): the record calls as RecordStoreWrapper's, and the rest.
class StoreWrapper : public ForwardingRecords<Store> {
 public:
  explicit StoreWrapper(std::unique_ptr<Store> base)
      : ForwardingRecords(base.get()), base_(std::move(base)) {}

  absl::Status Ping() override { return base_->Ping(); }
  void History(const HistoryQuery& query, HistoryFn done) override {
    base_->History(query, std::move(done));
  }
  void List(const ListQuery& query, ListFn done) override {
    base_->List(query, std::move(done));
  }
  absl::StatusOr<std::vector<Record>> ExpireLeases(
      int limit, const ExpireFn& expire) override {
    return base_->ExpireLeases(limit, expire);
  }
  absl::StatusOr<std::vector<RecordKey>> Purge(int limit) override {
    return base_->Purge(limit);
  }
  absl::StatusOr<StoreStats> Stats() override { return base_->Stats(); }
  absl::StatusOr<std::vector<ReconcileClaim>> ClaimUnknown(
      const std::map<std::string, int>& max_attempts, absl::Duration backoff,
      absl::Duration max_backoff, int limit) override {
    return base_->ClaimUnknown(max_attempts, backoff, max_backoff, limit);
  }
  ChangeFeed* Changes() override { return base_->Changes(); }

 protected:
  Store* base() { return base_.get(); }

 private:
  const std::unique_ptr<Store> base_;
};

}  // namespace idem

#endif  // IDEM_SERVER_STORE_STORE_H_
