#include "server/store/memory_store.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace idem {
namespace {

bool Terminal(Status s) {
  return s == Status::kSucceeded || s == Status::kFailed;
}

// (updated_at, key) order of listings.
bool Before(absl::Time at_a, const RecordKey& a, absl::Time at_b,
            const RecordKey& b) {
  if (at_a != at_b) return at_a < at_b;
  return a < b;
}

class MemoryStore final : public Store {
 public:
  explicit MemoryStore(std::function<absl::Time()> clock)
      : clock_(std::move(clock)) {}

  // The record calls answer at once, on the caller's thread.
  void Read(const RecordKey& key, ReadFn done) override {
    StoreRead read;
    {
      absl::MutexLock lock(&mu_);
      read.now = clock_();
      auto it = records_.find(key);
      if (it != records_.end()) read.record = it->second;
    }
    done(std::move(read));
  }

  void Apply(const Write& write, ApplyFn done) override {
    std::optional<Record> written;
    std::vector<RecordKey> settled;
    {
      absl::MutexLock lock(&mu_);
      written = ApplyLocked(write, clock_(), &settled);
    }
    Publish(settled);
    done(std::move(written));
  }

  absl::Status Ping() override { return absl::OkStatus(); }

  // Admin queries answer inline, outside the lock.
  void History(const HistoryQuery& q, HistoryFn done) override {
    std::vector<AuditEntry> out;
    {
      absl::MutexLock lock(&mu_);
      auto it = audit_.find(q.key);
      if (it != audit_.end()) {
        for (const AuditEntry& e : it->second) {
          if (out.size() == static_cast<size_t>(q.limit)) break;
          if (e.id > q.after_id) out.push_back(e);
        }
      }
    }
    done(std::move(out));
  }

  void List(const ListQuery& q, ListFn done) override { done(ListNow(q)); }

  absl::StatusOr<std::vector<Record>> ExpireLeases(
      int limit, const ExpireFn& expire) override {
    std::vector<RecordKey> settled;
    absl::ReleasableMutexLock lock(&mu_);
    const absl::Time now = clock_();
    std::vector<Record> due;
    for (const auto& [key, r] : records_) {
      if (r.status == Status::kProcessing && r.lease_expires_at <= now) {
        due.push_back(r);
      }
    }
    std::sort(due.begin(), due.end(), [](const Record& a, const Record& b) {
      return a.lease_expires_at < b.lease_expires_at;
    });
    std::vector<Record> out;
    for (const Record& r : due) {
      if (static_cast<int>(out.size()) >= limit) break;
      Decision d = expire(r, now);
      if (!d.error.ok() || !d.write) continue;
      std::optional<Record> written = ApplyLocked(*d.write, now, &settled);
      if (written) out.push_back(*std::move(written));
    }
    lock.Release();
    Publish(settled);
    return out;
  }

  absl::StatusOr<std::vector<RecordKey>> Purge(int limit) override {
    absl::MutexLock lock(&mu_);
    const absl::Time now = clock_();
    std::vector<RecordKey> out;
    for (auto it = records_.begin();
         it != records_.end() && static_cast<int>(out.size()) < limit;) {
      Record& r = it->second;
      if (!Terminal(r.status) || !r.expires_at || *r.expires_at > now) {
        ++it;
        continue;
      }
      out.push_back(it->first);
      Meta& m = meta_[it->first];
      if (!r.tombstone && m.tombstone_retention > absl::ZeroDuration()) {
        r.tombstone = true;
        r.result.reset();
        r.expires_at = *r.expires_at + m.tombstone_retention;
        ++it;
      } else {
        meta_.erase(it->first);
        it = records_.erase(it);
      }
    }
    return out;
  }

  absl::StatusOr<std::vector<ReconcileClaim>> ClaimUnknown(
      const std::map<std::string, int>& max_attempts, absl::Duration backoff,
      absl::Duration max_backoff, int limit) override {
    absl::MutexLock lock(&mu_);
    const absl::Time now = clock_();
    std::vector<ReconcileClaim> out;
    for (auto& [key, r] : records_) {
      if (static_cast<int>(out.size()) >= limit) break;
      auto max = max_attempts.find(key.operation);
      if (r.status != Status::kUnknown || max == max_attempts.end()) continue;
      Meta& m = meta_[key];
      if (m.attempts >= max->second || m.next_reconcile > now) continue;
      m.next_reconcile =
          now + std::min(max_backoff,
                         backoff * (int64_t{1} << std::min(m.attempts, 30)));
      ++m.attempts;
      out.push_back(ReconcileClaim{r, m.attempts});
    }
    return out;
  }

  ChangeFeed* Changes() override { return &feed_; }

  void CountProcessing(const std::string& tenant, CountFn done) override {
    int64_t n = 0;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [key, r] : records_) {
        if (key.tenant == tenant && r.status == Status::kProcessing) ++n;
      }
    }
    done(n);
  }

  absl::StatusOr<StoreStats> Stats() override {
    absl::MutexLock lock(&mu_);
    const absl::Time now = clock_();
    StoreStats stats;
    for (const auto& [key, r] : records_) {
      ++stats.records[r.status];
      if (r.status == Status::kUnknown) {
        stats.oldest_unknown_age =
            std::max(stats.oldest_unknown_age, now - r.updated_at);
      }
    }
    return stats;
  }

 private:
  std::vector<Record> ListNow(const ListQuery& q) {
    absl::MutexLock lock(&mu_);
    const absl::Time cutoff = clock_() - q.older_than;
    std::vector<Record> out;
    for (const auto& [key, r] : records_) {
      if (!q.tenant.empty() && key.tenant != q.tenant) continue;
      if (!q.operation.empty() && key.operation != q.operation) continue;
      if (q.status && r.status != *q.status) continue;
      if (r.updated_at > cutoff) continue;
      if (q.after &&
          !Before(q.after->updated_at, q.after->key, r.updated_at, key)) {
        continue;
      }
      out.push_back(r);
    }
    std::sort(out.begin(), out.end(), [](const Record& a, const Record& b) {
      return Before(a.updated_at, a.key, b.updated_at, b.key);
    });
    if (out.size() > static_cast<size_t>(q.limit)) out.resize(q.limit);
    if (q.max_bytes > 0) {
      size_t bytes = 0;
      for (size_t i = 0; i < out.size(); ++i) {
        bytes += ResultBytes(out[i]);
        if (bytes >= q.max_bytes) {
          out.resize(std::min(out.size(), i + 2));
          break;
        }
      }
    }
    return out;
  }

  // Publishes the changes once the lock is released: the feed's listener
  // may call the store.
  void Publish(const std::vector<RecordKey>& settled) {
    for (const RecordKey& key : settled) feed_.Publish(key);
  }

  // Adds the key of a record it settles to `settled`, to publish.
  std::optional<Record> ApplyLocked(const Write& write, absl::Time now,
                                    std::vector<RecordKey>* settled)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const RecordKey& key = write.next.key;
    auto it = records_.find(key);
    if (!write.guard) {
      if (it != records_.end()) return std::nullopt;
    } else {
      if (it == records_.end()) return std::nullopt;
      const Record& cur = it->second;
      const Guard& g = *write.guard;
      if (cur.status != g.status || cur.fencing_token != g.fencing_token ||
          (g.lease_expired && cur.lease_expires_at > now)) {
        return std::nullopt;
      }
    }
    Record next = write.next;
    if (write.lease) {
      next.lease_expires_at = now + *write.lease;
    } else if (it != records_.end()) {
      next.lease_expires_at = it->second.lease_expires_at;
    }
    next.expires_at.reset();
    if (write.retention) next.expires_at = now + *write.retention;
    next.created_at = it == records_.end() ? now : it->second.created_at;
    next.updated_at = now;
    if (write.audit) {
      AuditEntry entry = *write.audit;
      entry.at = now;
      entry.id = ++last_audit_id_;
      audit_[key].push_back(std::move(entry));
    }
    if (next.status != Status::kProcessing &&
        (it == records_.end() || it->second.status != next.status)) {
      settled->push_back(key);
    }
    // Any write resets the reconciliation of the record.
    meta_[key] = Meta{write.tombstone_retention};
    records_[key] = next;
    return next;
  }

  // Storage-only fields of a record.
  struct Meta {
    absl::Duration tombstone_retention = absl::ZeroDuration();
    int attempts = 0;
    absl::Time next_reconcile = absl::InfinitePast();
  };

  const std::function<absl::Time()> clock_;
  ChangeFeed feed_;
  absl::Mutex mu_;
  std::map<RecordKey, Meta> meta_ ABSL_GUARDED_BY(mu_);
  std::map<RecordKey, Record> records_ ABSL_GUARDED_BY(mu_);
  std::map<RecordKey, std::vector<AuditEntry>> audit_ ABSL_GUARDED_BY(mu_);
  int64_t last_audit_id_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

std::unique_ptr<Store> NewMemoryStore(std::function<absl::Time()> clock) {
  return std::make_unique<MemoryStore>(std::move(clock));
}

}  // namespace idem
