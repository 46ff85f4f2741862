// Blocking forms of the coordinator's and the store's record calls, for
// tests and tools that run on threads of their own (common/await.h): never
// on an RPC thread or a store's thread.
#ifndef IDEM_SERVER_CORE_SYNC_CALLS_H_
#define IDEM_SERVER_CORE_SYNC_CALLS_H_

#include <optional>
#include <utility>

#include "absl/status/statusor.h"
#include "common/await.h"
#include "server/core/coordinator.h"
#include "server/store/store.h"

namespace idem {

// A Coordinator whose calls also come in blocking forms that return the
// answer: Begin(key, cmd), Complete(key, cmd), ...
class SyncCoordinator : public Coordinator {
 public:
  using Coordinator::Begin;
  using Coordinator::Complete;
  using Coordinator::Coordinator;
  using Coordinator::Fail;
  using Coordinator::Get;
  using Coordinator::Heartbeat;
  using Coordinator::Resolve;

  absl::StatusOr<BeginResult> Begin(const RecordKey& key, BeginCommand cmd,
                                    bool cache_checked = false) {
    return Await<absl::StatusOr<BeginResult>>([&](BeginFn done) {
      Begin(key, std::move(cmd), std::move(done), cache_checked);
    });
  }
  absl::StatusOr<Record> Heartbeat(const RecordKey& key, HeartbeatCommand cmd) {
    return Await<absl::StatusOr<Record>>(
        [&](RecordFn done) { Heartbeat(key, cmd, std::move(done)); });
  }
  absl::StatusOr<Record> Complete(const RecordKey& key, CompleteCommand cmd) {
    return Await<absl::StatusOr<Record>>(
        [&](RecordFn done) { Complete(key, std::move(cmd), std::move(done)); });
  }
  absl::StatusOr<Record> Fail(const RecordKey& key, FailCommand cmd) {
    return Await<absl::StatusOr<Record>>(
        [&](RecordFn done) { Fail(key, std::move(cmd), std::move(done)); });
  }
  absl::StatusOr<Record> Get(const RecordKey& key) {
    return Await<absl::StatusOr<Record>>(
        [&](RecordFn done) { Get(key, std::move(done)); });
  }
  absl::StatusOr<Record> Resolve(const RecordKey& key, ResolveCommand cmd) {
    return Await<absl::StatusOr<Record>>(
        [&](RecordFn done) { Resolve(key, std::move(cmd), std::move(done)); });
  }
};

inline absl::StatusOr<StoreRead> ReadNow(Store& store, const RecordKey& key) {
  return Await<absl::StatusOr<StoreRead>>(
      [&](Store::ReadFn done) { store.Read(key, std::move(done)); });
}

inline absl::StatusOr<std::optional<Record>> ApplyNow(Store& store,
                                                      const Write& write) {
  return Await<absl::StatusOr<std::optional<Record>>>(
      [&](Store::ApplyFn done) { store.Apply(write, std::move(done)); });
}

inline absl::StatusOr<InsertOrReadResult> InsertOrReadNow(Store& store,
                                                          const Write& write) {
  return Await<absl::StatusOr<InsertOrReadResult>>(
      [&](Store::InsertOrReadFn done) {
        store.InsertOrRead(write, std::move(done));
      });
}

inline absl::StatusOr<std::vector<AuditEntry>> HistoryNow(
    AdminStore& store, const HistoryQuery& query) {
  return Await<absl::StatusOr<std::vector<AuditEntry>>>(
      [&](AdminStore::HistoryFn done) {
        store.History(query, std::move(done));
      });
}

inline absl::StatusOr<std::vector<Record>> ListNow(AdminStore& store,
                                                   const ListQuery& query) {
  return Await<absl::StatusOr<std::vector<Record>>>(
      [&](AdminStore::ListFn done) { store.List(query, std::move(done)); });
}

}  // namespace idem

#endif  // IDEM_SERVER_CORE_SYNC_CALLS_H_
