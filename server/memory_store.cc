#include "server/memory_store.h"

#include <map>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace idem {
namespace {

class MemoryStore final : public Store {
 public:
  explicit MemoryStore(std::function<absl::Time()> clock)
      : clock_(std::move(clock)) {}

  absl::StatusOr<StoreRead> Read(const RecordKey& key) override {
    absl::MutexLock lock(&mu_);
    StoreRead read;
    read.now = clock_();
    auto it = records_.find(key);
    if (it != records_.end()) read.record = it->second;
    return read;
  }

  absl::StatusOr<std::optional<Record>> Apply(const Write& write) override {
    absl::MutexLock lock(&mu_);
    const absl::Time now = clock_();
    const RecordKey& key = write.next.key;
    auto it = records_.find(key);
    if (!write.guard) {
      if (it != records_.end()) return std::optional<Record>();
    } else {
      if (it == records_.end()) return std::optional<Record>();
      const Record& cur = it->second;
      const Guard& g = *write.guard;
      if (cur.status != g.status || cur.fencing_token != g.fencing_token ||
          (g.lease_expired && cur.lease_expires_at > now)) {
        return std::optional<Record>();
      }
    }
    Record next = write.next;
    if (write.lease) next.lease_expires_at = now + *write.lease;
    next.expires_at.reset();
    if (write.retention) next.expires_at = now + *write.retention;
    next.created_at = it == records_.end() ? now : it->second.created_at;
    next.updated_at = now;
    if (write.audit) {
      AuditEntry entry = *write.audit;
      entry.at = now;
      audit_[key].push_back(std::move(entry));
    }
    records_[key] = next;
    return std::optional<Record>(std::move(next));
  }

  absl::Status Ping() override { return absl::OkStatus(); }

  absl::StatusOr<std::vector<AuditEntry>> History(
      const RecordKey& key) override {
    absl::MutexLock lock(&mu_);
    auto it = audit_.find(key);
    if (it == audit_.end()) return std::vector<AuditEntry>();
    return it->second;
  }

 private:
  const std::function<absl::Time()> clock_;
  absl::Mutex mu_;
  std::map<RecordKey, Record> records_ ABSL_GUARDED_BY(mu_);
  std::map<RecordKey, std::vector<AuditEntry>> audit_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<Store> NewMemoryStore(std::function<absl::Time()> clock) {
  return std::make_unique<MemoryStore>(std::move(clock));
}

}  // namespace idem
