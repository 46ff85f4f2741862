#include "server/cache/redis_store.h"

#include <atomic>
#include <chrono>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/group_commit.h"
#include "server/base/log.h"
#include "server/base/thread_names.h"
#include "server/cache/cache_fill.h"
#include "server/cache/redis_codec.h"

namespace idem {
namespace {

// The idem_redis_fallback_total reason of a failed lookup.
const char* FallbackReason(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kDeadlineExceeded:
      return "timeout";
    case absl::StatusCode::kFailedPrecondition:
      return "breaker_open";
    default:
      return "error";
  }
}

class RedisCacheStore final : public CacheFillingStore {
 public:
  RedisCacheStore(RecordStore* base, std::unique_ptr<RedisClient> redis,
                  std::shared_ptr<const CacheMac> mac, CacheMetrics* metrics,
                  std::function<absl::Time()> clock)
      : CacheFillingStore(base),
        redis_(std::move(redis)),
        mac_(std::move(mac)),
        metrics_(metrics),
        clock_(std::move(clock)),
        lookups_(kMaxLookupBatch, /*max_inflight=*/1,
                 [this](const std::vector<Lookup*>& batch) { Flush(batch); }),
        async_fills_(
            kMaxFillBatch, kFillThreads,
            [this](std::vector<AsyncFill>& batch) { FlushFills(batch); },
            thread_names::kRedisSet) {}

  // Concurrent lookups share one pipelined round trip (group_commit.h).
  std::optional<CachedRecord> ReadCached(const RecordKey& key) override {
    Lookup call{&key, SteadyClock::now(), std::nullopt};
    lookups_.Run(&call);
    return std::move(call.result);
  }

  // One pipelined round trip on the caller's thread, in chunks of at most
  // kMaxLookupBatch.
  std::vector<std::optional<CachedRecord>> ReadCachedMany(
      const std::vector<const RecordKey*>& keys) override {
    const SteadyTime start = SteadyClock::now();
    std::vector<Lookup> calls;
    calls.reserve(keys.size());
    for (const RecordKey* key : keys) {
      calls.push_back(Lookup{key, start, std::nullopt});
    }
    std::vector<Lookup*> chunk;
    for (size_t i = 0; i < calls.size(); i += kMaxLookupBatch) {
      chunk.clear();
      for (size_t j = i; j < std::min(calls.size(), i + kMaxLookupBatch); ++j) {
        chunk.push_back(&calls[j]);
      }
      Flush(chunk);
    }
    std::vector<std::optional<CachedRecord>> out;
    out.reserve(calls.size());
    for (Lookup& call : calls) out.push_back(std::move(call.result));
    return out;
  }

  void Forget(const std::vector<RecordKey>& purged) override {
    base()->Forget(purged);
    if (purged.empty()) return;
    std::vector<std::string> keys;
    keys.reserve(purged.size());
    for (const RecordKey& k : purged) keys.push_back(CacheKey(k));
    const SteadyTime start = SteadyClock::now();
    absl::Status s = redis_->Del(keys);
    Observe("del", start, s);
    if (!s.ok()) {
      // Harmless: each entry's TTL ends no later than its record's
      // expires_at, which purging needs to have passed.
      Log(LogLevel::kWarn, "purged records left in redis until their TTL ends",
          {{"count", absl::StrCat(keys.size())},
           {"error", std::string(s.message())}});
    }
  }

 private:
  struct Lookup {
    const RecordKey* key;
    SteadyTime start;
    std::optional<CachedRecord> result;
  };
  // A SET queued by FillAsync, and what runs once it is done.
  struct AsyncFill {
    RedisSet set;
    SteadyTime start;
    std::function<void()> then;
  };
  static constexpr size_t kMaxLookupBatch = 64;
  static constexpr size_t kMaxFillBatch = 64;
  // One thread waits on a round trip while the other runs completions.
  static constexpr int kFillThreads = 2;

  // One pipelined round trip for the values of `batch`, and one more to
  // delete those that are not used, if any: before the store reads that
  // follow fill the cache again.
  void Flush(const std::vector<Lookup*>& batch) {
    std::vector<std::string> keys;
    keys.reserve(batch.size());
    for (const Lookup* call : batch) keys.push_back(CacheKey(*call->key));
    absl::StatusOr<std::vector<std::optional<RedisValue>>> values =
        redis_->GetMany(keys);
    std::vector<std::string> bad;
    for (size_t i = 0; i < batch.size(); ++i) {
      Observe("get", batch[i]->start, values.status());
      if (!values.ok()) {
        metrics_->RedisFallback(FallbackReason(values.status()));
        continue;
      }
      batch[i]->result = Decode(*batch[i]->key, (*values)[i],
                                SteadySince(batch[i]->start), &bad);
    }
    if (!bad.empty()) Delete(bad);
  }

  // The record in a looked-up `value` of `key`, or nullopt (counted); its
  // TTL less the `elapsed` time of the lookup (Redis measured it somewhere
  // in between), and never past its expires_at. The key of a value that is
  // not used is added to `*bad`.
  std::optional<CachedRecord> Decode(const RecordKey& key,
                                     const std::optional<RedisValue>& value,
                                     absl::Duration elapsed,
                                     std::vector<std::string>* bad) {
    if (!value.has_value()) {
      metrics_->RedisFallback("miss");
      return std::nullopt;
    }
    absl::StatusOr<Record> record = DecodeCacheValue(key, value->value, *mac_);
    if (!record.ok()) {
      Refuse(key, CacheRefusalReason(record.status()),
             record.status().message(), bad);
      return std::nullopt;
    }
    // The MAC does not cover the TTL: whoever may write to Redis may also
    // take it away or stretch it.
    if (!value->ttl.has_value()) {
      Refuse(key, "no_ttl", "the value has no TTL", bad);
      return std::nullopt;
    }
    const absl::Duration left = *record->expires_at - clock_();
    if (left <= absl::ZeroDuration()) {
      Refuse(key, "expired", "the record's expires_at has passed", bad);
      return std::nullopt;
    }
    return CachedRecord{
        std::make_shared<const Record>(*std::move(record)),
        std::max(absl::ZeroDuration(), std::min(*value->ttl - elapsed, left)),
        "redis"};
  }

  // Counts a value of `key` that is not used for `reason`, logs it (at most
  // once a second) and adds its key to `*bad`.
  void Refuse(const RecordKey& key, const char* reason, absl::string_view why,
              std::vector<std::string>* bad) {
    metrics_->RedisFallback(reason);
    bad->push_back(CacheKey(key));
    int64_t skipped = 0;
    if (!bad_value_log_.Due(&skipped)) return;
    Log(LogLevel::kWarn, "ignored and deleted a bad redis value",
        {{"tenant", key.tenant},
         {"operation", key.operation},
         {"key", key.key},
         {"reason", reason},
         {"error", std::string(why)},
         {"bad_values_not_logged", absl::StrCat(skipped)}});
  }

  // Deletes the `keys` of values that were not used: nothing else would (a
  // store read refills a key only when it finds a cacheable record). A good
  // value another instance wrote since the lookup goes too: a later miss.
  void Delete(const std::vector<std::string>& keys) {
    const SteadyTime start = SteadyClock::now();
    const absl::Status s = redis_->Del(keys);
    Observe("del", start, s);
    if (!s.ok()) {
      Log(LogLevel::kDebug, "bad redis values not deleted",
          {{"count", absl::StrCat(keys.size())},
           {"error", std::string(s.message())}});
    }
  }

  // Caches `record` if it may be (CacheTtl), queued: the SETs of concurrent
  // completions (a batch of Completes) share one pipelined round trip on
  // the fill threads, which then run each `then`.
  void Fill(const Record& record, absl::Time store_now, absl::Duration elapsed,
            std::function<void()> then) override {
    std::optional<RedisSet> set = ToSet(record, store_now, elapsed);
    if (!set) return then();
    async_fills_.Submit(
        AsyncFill{*std::move(set), SteadyClock::now(), std::move(then)});
  }

  void FlushFills(std::vector<AsyncFill>& batch) {
    std::vector<RedisSet> sets;
    sets.reserve(batch.size());
    for (AsyncFill& f : batch) {
      // The time queued counts against the TTL, which must still end no
      // later than the record's expires_at.
      f.set.ttl =
          absl::Floor(f.set.ttl - SteadySince(f.start), absl::Milliseconds(1));
      if (f.set.ttl >= absl::Milliseconds(1)) sets.push_back(std::move(f.set));
    }
    const absl::Status s = redis_->SetMany(sets);
    if (!s.ok()) {
      Log(LogLevel::kDebug, "records not cached",
          {{"count", absl::StrCat(sets.size())},
           {"error", std::string(s.message())}});
    }
    for (AsyncFill& f : batch) {
      Observe("set", f.start, s);
      f.then();
    }
  }

  // The SET that caches `record`, if it may be (CacheTtl).
  std::optional<RedisSet> ToSet(const Record& record, absl::Time store_now,
                                absl::Duration elapsed) const {
    std::optional<absl::Duration> ttl = CacheTtl(record, store_now, elapsed);
    if (!ttl) return std::nullopt;
    return RedisSet{CacheKey(record.key), EncodeCacheValue(record, *mac_),
                    *ttl};
  }

  // Times a Redis call and counts it if it failed (a call the open breaker
  // refused is not a Redis error).
  void Observe(const char* op, SteadyTime start, const absl::Status& s) {
    if (s.code() == absl::StatusCode::kFailedPrecondition) return;
    metrics_->ObserveStore("redis", op, SteadySince(start));
    if (!s.ok()) {
      metrics_->StoreError(
          "redis", absl::AsciiStrToLower(absl::StatusCodeToString(s.code())));
    }
  }

  const std::unique_ptr<RedisClient> redis_;
  const std::shared_ptr<const CacheMac> mac_;
  CacheMetrics* const metrics_;
  const std::function<absl::Time()> clock_;
  OncePerSecond bad_value_log_;
  GroupCommit<Lookup> lookups_;
  // Last: its threads stop before the members they use go.
  BatchThreads<AsyncFill> async_fills_;
};

}  // namespace

std::unique_ptr<RecordStore> NewRedisCacheStore(
    RecordStore* base, std::unique_ptr<RedisClient> redis,
    std::shared_ptr<const CacheMac> mac, CacheMetrics* metrics,
    std::function<absl::Time()> clock) {
  return std::make_unique<RedisCacheStore>(
      base, std::move(redis), std::move(mac), metrics, std::move(clock));
}

}  // namespace idem
