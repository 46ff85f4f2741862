#include "server/cache/local_cache.h"

#include <functional>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/steady_wait.h"
#include "server/cache/cache_fill.h"
#include "server/cache/redis_codec.h"

namespace idem {
namespace {

std::string FlatKey(const RecordKey& k) {
  std::string flat;
  flat.reserve(k.tenant.size() + k.operation.size() + k.key.size() + 2);
  flat.append(k.tenant).push_back('\0');
  flat.append(k.operation).push_back('\0');
  flat.append(k.key);
  return flat;
}

// Rough bytes an entry of `record` holds.
size_t Footprint(const std::string& flat, const Record& r) {
  size_t n = 2 * flat.size() + r.request_hash.size() + r.resolved_by.size() +
             r.resolve_reason.size() + sizeof(Record) + 128;
  if (r.result) {
    n += r.result->body.size() + r.result->content_type.size();
    for (const auto& [k, v] : r.result->headers) n += k.size() + v.size() + 64;
  }
  return n;
}

// One LRU list with its index, under one lock.
class Shard {
 public:
  std::optional<CachedRecord> Get(const std::string& flat) {
    SteadyMutexLock lock(&mu_);
    auto it = index_.find(flat);
    if (it == index_.end()) return std::nullopt;
    const auto now = SteadyClock::now();
    if (now >= it->second->deadline) {
      Erase(it);
      return std::nullopt;
    }
    lru_.splice(lru_.begin(), lru_, it->second);
    return CachedRecord{it->second->record,
                        absl::FromChrono(it->second->deadline - now), "memory"};
  }

  void Put(std::string flat, std::shared_ptr<const Record> record,
           SteadyTime deadline, size_t budget) {
    const size_t bytes = Footprint(flat, *record);
    if (bytes > budget / 8) return;  // one entry may not crowd out the rest
    SteadyMutexLock lock(&mu_);
    auto it = index_.find(flat);
    if (it != index_.end()) Erase(it);
    lru_.push_front(Entry{flat, std::move(record), deadline, bytes});
    index_.emplace(std::move(flat), lru_.begin());
    bytes_ += bytes;
    while (bytes_ > budget && !lru_.empty()) {
      Erase(index_.find(lru_.back().flat));
    }
  }

  void Drop(const std::string& flat) {
    SteadyMutexLock lock(&mu_);
    auto it = index_.find(flat);
    if (it != index_.end()) Erase(it);
  }

 private:
  struct Entry {
    std::string flat;
    // Shared with the hits handed out: an entry dropped while a caller
    // still answers from it stays alive until that answer is sent.
    std::shared_ptr<const Record> record;
    SteadyTime deadline;
    size_t bytes;
  };
  using Index = std::unordered_map<std::string, std::list<Entry>::iterator>;

  void Erase(Index::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    bytes_ -= it->second->bytes;
    lru_.erase(it->second);
    index_.erase(it);
  }

  SteadyMutex mu_;
  std::list<Entry> lru_ ABSL_GUARDED_BY(mu_);  // most recently used first
  Index index_ ABSL_GUARDED_BY(mu_);
  size_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

class LocalCacheStore final : public CacheFillingStore {
 public:
  LocalCacheStore(RecordStore* base, LocalCacheOptions options)
      : CacheFillingStore(base),
        options_(options),
        shard_budget_(options.max_bytes / kShards) {}

  std::optional<CachedRecord> ReadCached(const RecordKey& key) override {
    const std::string flat = FlatKey(key);
    Shard& shard = ShardOf(flat);
    if (std::optional<CachedRecord> hit = shard.Get(flat)) return hit;
    std::optional<CachedRecord> below = base()->ReadCached(key);
    Keep(shard, flat, below);
    return below;
  }

  // Answers what it holds; asks the cache below for the rest at once.
  std::vector<std::optional<CachedRecord>> ReadCachedMany(
      const std::vector<const RecordKey*>& keys) override {
    std::vector<std::optional<CachedRecord>> out(keys.size());
    std::vector<std::string> flats(keys.size());
    std::vector<const RecordKey*> below_keys;
    std::vector<size_t> below_at;
    for (size_t i = 0; i < keys.size(); ++i) {
      flats[i] = FlatKey(*keys[i]);
      out[i] = ShardOf(flats[i]).Get(flats[i]);
      if (!out[i]) {
        below_keys.push_back(keys[i]);
        below_at.push_back(i);
      }
    }
    if (below_keys.empty()) return out;
    std::vector<std::optional<CachedRecord>> below =
        base()->ReadCachedMany(below_keys);
    for (size_t j = 0; j < below_at.size(); ++j) {
      const size_t i = below_at[j];
      Keep(ShardOf(flats[i]), flats[i], below[j]);
      out[i] = std::move(below[j]);
    }
    return out;
  }

  void Forget(const std::vector<RecordKey>& purged) override {
    for (const RecordKey& k : purged) {
      const std::string flat = FlatKey(k);
      ShardOf(flat).Drop(flat);
    }
    base()->Forget(purged);
  }

 private:
  static constexpr size_t kShards = 16;

  // Keeps what the cache below answered, if it may.
  void Keep(Shard& shard, const std::string& flat,
            const std::optional<CachedRecord>& below) {
    if (below && Cacheable(*below->record)) {
      shard.Put(flat, below->record,
                SteadyDeadline(std::min(below->ttl, options_.max_ttl)),
                shard_budget_);
    }
  }

  Shard& ShardOf(const std::string& flat) {
    return shards_[std::hash<std::string>()(flat) % kShards];
  }

  // Caches `record` if it may be (CacheTtl: no entry outlives the record's
  // expires_at, however long the store call took).
  // At once, on the caller's thread.
  void Fill(const Record& record, absl::Time store_now, absl::Duration elapsed,
            std::function<void()> then) override {
    if (std::optional<absl::Duration> ttl =
            CacheTtl(record, store_now, elapsed)) {
      const std::string flat = FlatKey(record.key);
      ShardOf(flat).Put(flat, std::make_shared<const Record>(record),
                        SteadyDeadline(std::min(*ttl, options_.max_ttl)),
                        shard_budget_);
    }
    then();
  }

  const LocalCacheOptions options_;
  const size_t shard_budget_;
  Shard shards_[kShards];
};

}  // namespace

std::unique_ptr<RecordStore> NewLocalCacheStore(RecordStore* base,
                                                LocalCacheOptions options) {
  if (options.max_bytes == 0) return nullptr;
  return std::make_unique<LocalCacheStore>(base, options);
}

}  // namespace idem
