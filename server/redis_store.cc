#include "server/redis_store.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/log.h"
#include "server/redis_codec.h"

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

class RedisCacheStore final : public StoreWrapper {
 public:
  RedisCacheStore(std::unique_ptr<Store> base,
                  std::unique_ptr<RedisClient> redis, Metrics* metrics)
      : StoreWrapper(std::move(base)),
        redis_(std::move(redis)),
        metrics_(metrics) {}

  std::optional<Record> ReadCached(const RecordKey& key) override {
    const absl::Time start = absl::Now();
    absl::StatusOr<std::optional<std::string>> value =
        redis_->Get(CacheKey(key));
    Observe("get", start, value.status());
    if (!value.ok()) {
      metrics_->RedisFallback(FallbackReason(value.status()));
      return std::nullopt;
    }
    if (!value->has_value()) {
      metrics_->RedisFallback("miss");
      return std::nullopt;
    }
    absl::StatusOr<Record> record = DecodeCacheValue(key, **value);
    if (!record.ok()) {
      // The read from the store that follows overwrites the value.
      metrics_->RedisFallback("corrupt");
      Log(LogLevel::kWarn, "ignored a bad redis value",
          {{"tenant", key.tenant},
           {"operation", key.operation},
           {"key", key.key},
           {"error", std::string(record.status().message())}});
      return std::nullopt;
    }
    return *std::move(record);
  }

  absl::StatusOr<StoreRead> Read(const RecordKey& key) override {
    const absl::Time start = absl::Now();
    absl::StatusOr<StoreRead> read = base()->Read(key);
    if (read.ok() && read->record) Fill(*read->record, read->now, start);
    return read;
  }

  absl::StatusOr<std::optional<Record>> Apply(const Write& write) override {
    const absl::Time start = absl::Now();
    absl::StatusOr<std::optional<Record>> written = base()->Apply(write);
    // A store stamps a write's updated_at with its own clock.
    if (written.ok() && written->has_value()) {
      Fill(**written, (*written)->updated_at, start);
    }
    return written;
  }

  absl::StatusOr<std::vector<RecordKey>> Purge(int limit) override {
    absl::StatusOr<std::vector<RecordKey>> purged = base()->Purge(limit);
    if (!purged.ok() || purged->empty()) return purged;
    std::vector<std::string> keys;
    keys.reserve(purged->size());
    for (const RecordKey& k : *purged) keys.push_back(CacheKey(k));
    const absl::Time start = absl::Now();
    absl::Status s = redis_->Del(keys);
    Observe("del", start, s);
    if (!s.ok()) {
      // Harmless: each entry's TTL ends no later than its record's
      // expires_at, which purging needs to have passed.
      Log(LogLevel::kWarn, "purged records left in redis until their TTL ends",
          {{"count", absl::StrCat(keys.size())},
           {"error", std::string(s.message())}});
    }
    return purged;
  }

 private:
  // Caches `record` if it may be, as seen by the store at `store_now`; the
  // store call began at local time `start`.
  void Fill(const Record& record, absl::Time store_now, absl::Time start) {
    const absl::Time now = absl::Now();
    std::optional<absl::Duration> ttl =
        CacheTtl(record, store_now, now - start);
    if (!ttl) return;
    absl::Status s =
        redis_->Set(CacheKey(record.key), EncodeCacheValue(record), *ttl);
    Observe("set", now, s);
    if (!s.ok()) {
      Log(LogLevel::kDebug, "record not cached",
          {{"tenant", record.key.tenant},
           {"operation", record.key.operation},
           {"key", record.key.key},
           {"error", std::string(s.message())}});
    }
  }

  // Times a Redis call and counts it if it failed (a call the open breaker
  // refused is not a Redis error).
  void Observe(const char* op, absl::Time start, const absl::Status& s) {
    if (s.code() == absl::StatusCode::kFailedPrecondition) return;
    metrics_->ObserveStore("redis", op, absl::Now() - start);
    if (!s.ok()) {
      metrics_->StoreError(
          "redis", absl::AsciiStrToLower(absl::StatusCodeToString(s.code())));
    }
  }

  const std::unique_ptr<RedisClient> redis_;
  Metrics* const metrics_;
};

}  // namespace

std::unique_ptr<Store> NewRedisCacheStore(std::unique_ptr<Store> base,
                                          std::unique_ptr<RedisClient> redis,
                                          Metrics* metrics) {
  return std::make_unique<RedisCacheStore>(std::move(base), std::move(redis),
                                           metrics);
}

}  // namespace idem
