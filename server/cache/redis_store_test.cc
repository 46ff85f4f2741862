// The Redis cache decorator and the coordinator's use of it, over the memory
// store with a fake Redis client: what is cached, for how long, and that no
// cache answer or failure changes what callers are told.
#include "server/cache/redis_store.h"

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <numeric>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "common/steady_wait.h"
#include "gtest/gtest.h"
#include "server/cache/local_cache.h"
#include "server/cache/redis_codec.h"
#include "server/core/sync_calls.h"
#include "server/metrics/metrics.h"
#include "server/store/memory_store.h"

namespace idem {
namespace {

// A map with the TTLs it was given; every call fails with `failure` when
// that is not OK. SetMany runs `before_set` first (if set) and keeps the size
// of each call in `set_batches`.
class FakeRedis final : public RedisClient {
 public:
  struct Entry {
    std::string value;
    std::optional<absl::Duration> ttl;  // nullopt: none (PERSIST)
  };

  absl::StatusOr<std::vector<std::optional<RedisValue>>> GetMany(
      const std::vector<std::string>& keys) override {
    gets += static_cast<int>(keys.size());
    if (!failure.ok()) return failure;
    std::vector<std::optional<RedisValue>> out;
    for (const std::string& key : keys) {
      auto it = data.find(key);
      if (it == data.end()) {
        out.emplace_back(std::nullopt);
      } else {
        out.emplace_back(RedisValue{it->second.value, it->second.ttl});
      }
    }
    return out;
  }
  absl::Status SetMany(const std::vector<RedisSet>& sets) override {
    std::function<void()> gate;
    {
      SteadyMutexLock lock(&mu);
      gate = before_set;
    }
    if (gate) gate();
    SteadyMutexLock lock(&mu);
    set_batches.push_back(sets.size());
    if (!failure.ok()) return failure;
    for (const RedisSet& s : sets) data[s.key] = Entry{s.value, s.ttl};
    return absl::OkStatus();
  }
  absl::Status Del(const std::vector<std::string>& keys) override {
    if (!failure.ok()) return failure;
    for (const std::string& k : keys) data.erase(k);
    dels += static_cast<int>(keys.size());
    return absl::OkStatus();
  }

  // A client of a Redis holding what this one holds.
  std::unique_ptr<RedisClient> Copy() {
    auto copy = std::make_unique<FakeRedis>();
    SteadyMutexLock lock(&mu);
    copy->data = data;
    return copy;
  }

  bool Has(const std::string& key) {
    SteadyMutexLock lock(&mu);
    return data.count(key) == 1;
  }

  // Tests that fill from other threads (FillAsync) read through Has, and
  // the rest only once those threads are done.
  SteadyMutex mu;
  std::map<std::string, Entry> data;
  absl::Status failure;
  int gets = 0;
  int dels = 0;
  std::function<void()> before_set ABSL_GUARDED_BY(mu);
  std::vector<size_t> set_batches ABSL_GUARDED_BY(mu);
};

// Counts the calls that reach the store under the cache.
class CountingStore final : public RecordStoreWrapper {
 public:
  using RecordStoreWrapper::RecordStoreWrapper;

  void Read(const RecordKey& key, ReadFn done) override {
    ++calls;
    RecordStoreWrapper::Read(key, std::move(done));
  }
  void Apply(const Write& write, ApplyFn done) override {
    ++calls;
    RecordStoreWrapper::Apply(write, std::move(done));
  }
  void InsertOrRead(const Write& write, InsertOrReadFn done) override {
    ++calls;
    RecordStoreWrapper::InsertOrRead(write, std::move(done));
  }

  int calls = 0;
};

class RedisStoreTest : public ::testing::Test {
 protected:
  RedisStoreTest() {
    auto redis = std::make_unique<FakeRedis>();
    redis_ = redis.get();
    redis_cache_ = NewRedisCacheStore(base_.get(), std::move(redis), mac_,
                                      &metrics_, [this] { return now_; });
    store_ = redis_cache_.get();
    Policy defaults;
    defaults.retention = absl::Hours(1);
    policies_ = PolicySet(defaults, {});
    coordinator_ =
        std::make_unique<SyncCoordinator>(store_, &policies_, &metrics_);
  }

  // Begins `key` with hash "h" and completes it with `body`.
  Record Finish(const RecordKey& key, const std::string& body) {
    absl::StatusOr<BeginResult> grant = coordinator_->Begin(key, Cmd("h"));
    EXPECT_TRUE(grant.ok() && grant->outcome == Outcome::kAcquired);
    CompleteCommand done;
    done.fencing_token = grant->record->fencing_token;
    done.result.code = 200;
    done.result.body = body;
    absl::StatusOr<Record> r = coordinator_->Complete(key, done);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : Record{};
  }

  static BeginCommand Cmd(const std::string& hash) {
    BeginCommand c;
    c.request_hash = hash;
    return c;
  }

  double Fallbacks(const std::string& reason) {
    for (const auto& family : metrics_.registry()->Collect()) {
      if (family.name != "idem_redis_fallback_total") continue;
      for (const auto& m : family.metric) {
        if (m.label.size() == 1 && m.label[0].value == reason) {
          return m.counter.value;
        }
      }
    }
    return 0;
  }

  absl::Time now_ = absl::FromUnixSeconds(1700000000);
  const std::shared_ptr<const CacheMac> mac_ =
      *CacheMac::Create(std::string(32, 'k'));
  Metrics metrics_;
  PolicySet policies_;
  FakeRedis* redis_;
  // Purges the backing store and tells the caches, as maintenance does.
  absl::StatusOr<std::vector<RecordKey>> Purge() {
    absl::StatusOr<std::vector<RecordKey>> purged = memory_->Purge(10);
    if (purged.ok()) store_->Forget(*purged);
    return purged;
  }

  const std::unique_ptr<Store> memory_ =
      NewMemoryStore([this] { return now_; });
  // The chain, each over the one before: the counting store, the Redis
  // cache and (LocalCacheTest) the in-process cache.
  const std::unique_ptr<CountingStore> base_ =
      std::make_unique<CountingStore>(memory_.get());
  std::unique_ptr<RecordStore> redis_cache_;
  std::unique_ptr<RecordStore> local_cache_;
  // The top of the chain.
  RecordStore* store_ = nullptr;
  std::unique_ptr<SyncCoordinator> coordinator_;
  const RecordKey key_{"t", "create-payment", "k"};
};

TEST_F(RedisStoreTest, CompleteWritesThroughWithATtlOfTheRetention) {
  const Record done = Finish(key_, "paid");
  ASSERT_EQ(redis_->data.count(CacheKey(key_)), 1u);
  const FakeRedis::Entry& e = redis_->data[CacheKey(key_)];
  EXPECT_LE(*e.ttl, absl::Hours(1));
  EXPECT_GT(*e.ttl, absl::Hours(1) - absl::Seconds(1));
  absl::StatusOr<Record> cached = DecodeCacheValue(key_, e.value, *mac_);
  ASSERT_TRUE(cached.ok()) << cached.status();
  EXPECT_EQ(cached->result, done.result);
  EXPECT_EQ(cached->fencing_token, done.fencing_token);
}

// Completes through the non-blocking path: each record is in Redis before
// its caller hears back, the SETs of completions queued meanwhile share one
// pipelined round trip, and a Redis that fails them fails no Complete.
TEST_F(RedisStoreTest, AsyncCompletesAreCachedBeforeTheyFinish) {
  for (const bool redis_up : {true, false}) {
    SCOPED_TRACE(redis_up ? "redis up" : "redis failing");
    {
      SteadyMutexLock lock(&redis_->mu);
      redis_->failure =
          redis_up ? absl::OkStatus() : absl::UnavailableError("reset");
      redis_->set_batches.clear();
    }
    constexpr int kRecords = 20;
    std::vector<RecordKey> keys;
    std::vector<CompleteCommand> commands;
    for (int i = 0; i < kRecords; ++i) {
      keys.push_back(RecordKey{"t", "create-payment",
                               absl::StrCat(redis_up ? "up-" : "down-", i)});
      absl::StatusOr<BeginResult> grant =
          coordinator_->Begin(keys.back(), Cmd("h"));
      ASSERT_TRUE(grant.ok() && grant->outcome == Outcome::kAcquired);
      CompleteCommand done;
      done.fencing_token = grant->record->fencing_token;
      done.result.code = 200;
      done.result.body = absl::StrCat("paid ", i);
      commands.push_back(done);
    }
    // Every SET waits until all Completes are queued (a bounded wait: a
    // cache that filled inline would otherwise never get there). Standard
    // library waits: ThreadSanitizer sees neither absl::Notification nor
    // absl::BlockingCounter (tsan/absl_tsan_annotations.cc covers only Mutex
    // and CondVar of Debian's uninstrumented Abseil).
    SteadyNotification queued;
    {
      SteadyMutexLock lock(&redis_->mu);
      redis_->before_set = [&queued] {
        queued.WaitForNotificationWithTimeout(absl::Milliseconds(200));
      };
    }
    std::mutex finished_mu;
    std::condition_variable finished_cv;
    int unfinished = kRecords;
    std::atomic<int> succeeded{0};
    std::atomic<int> cached_before_done{0};
    for (int i = 0; i < kRecords; ++i) {
      coordinator_->Complete(keys[i], commands[i],
                             [&, i](absl::StatusOr<Record> r) {
                               if (r.ok() && r->result &&
                                   r->result->body == commands[i].result.body) {
                                 ++succeeded;
                               }
                               if (redis_->Has(CacheKey(keys[i])))
                                 ++cached_before_done;
                               std::lock_guard<std::mutex> lock(finished_mu);
                               if (--unfinished == 0) finished_cv.notify_all();
                             });
    }
    queued.Notify();
    {
      std::unique_lock<std::mutex> lock(finished_mu);
      finished_cv.wait(lock, [&] { return unfinished == 0; });
    }
    EXPECT_EQ(succeeded.load(), kRecords);
    EXPECT_EQ(cached_before_done.load(), redis_up ? kRecords : 0);
    // At most one SET each went out alone on the two fill threads before
    // the rest were queued; those shared a round trip.
    SteadyMutexLock lock(&redis_->mu);
    redis_->before_set = nullptr;
    EXPECT_LE(redis_->set_batches.size(), 3u);
    EXPECT_EQ(std::accumulate(redis_->set_batches.begin(),
                              redis_->set_batches.end(), size_t{0}),
              static_cast<size_t>(kRecords));
  }
}

TEST_F(RedisStoreTest, ReplaysAndMismatchesComeFromTheCacheAlone) {
  const Record done = Finish(key_, "paid");
  const int calls = base_->calls;
  absl::StatusOr<BeginResult> replay = coordinator_->Begin(key_, Cmd("h"));
  ASSERT_TRUE(replay.ok()) << replay.status();
  EXPECT_EQ(replay->outcome, Outcome::kCompleted);
  EXPECT_TRUE(replay->cached);
  EXPECT_EQ(replay->record->result, done.result);
  absl::StatusOr<BeginResult> other = coordinator_->Begin(key_, Cmd("other"));
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(other->outcome, Outcome::kMismatch);
  EXPECT_TRUE(other->cached);
  absl::StatusOr<Record> got = coordinator_->Get(key_);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->result, done.result);
  EXPECT_EQ(base_->calls, calls);
}

TEST_F(RedisStoreTest, RecordsThatMayStillChangeAreNotCached) {
  absl::StatusOr<BeginResult> grant = coordinator_->Begin(key_, Cmd("h"));
  ASSERT_TRUE(grant.ok());
  EXPECT_TRUE(redis_->data.empty());  // PROCESSING
  FailCommand fail;
  fail.fencing_token = grant->record->fencing_token;
  fail.error.code = 503;
  fail.retryable = true;
  ASSERT_TRUE(coordinator_->Fail(key_, fail).ok());
  EXPECT_TRUE(redis_->data.empty());  // FAILED, retryable
  absl::StatusOr<BeginResult> again = coordinator_->Begin(key_, Cmd("h"));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->outcome, Outcome::kAcquired);
  EXPECT_FALSE(again->cached);
  fail.fencing_token = again->record->fencing_token;
  fail.retryable = false;
  ASSERT_TRUE(coordinator_->Fail(key_, fail).ok());
  EXPECT_EQ(redis_->data.count(CacheKey(key_)), 1u);
  absl::StatusOr<BeginResult> replay = coordinator_->Begin(key_, Cmd("h"));
  ASSERT_TRUE(replay.ok());
  EXPECT_EQ(replay->outcome, Outcome::kFailed);
  EXPECT_TRUE(replay->cached);
}

TEST_F(RedisStoreTest, FailuresFallThroughToTheStore) {
  const Record done = Finish(key_, "paid");
  for (const auto& [failure, reason] :
       {std::pair{absl::DeadlineExceededError("slow"), "timeout"},
        std::pair{absl::FailedPreconditionError("open"), "breaker_open"},
        std::pair{absl::UnavailableError("reset"), "error"}}) {
    redis_->failure = failure;
    const int calls = base_->calls;
    absl::StatusOr<BeginResult> replay = coordinator_->Begin(key_, Cmd("h"));
    ASSERT_TRUE(replay.ok()) << replay.status();
    EXPECT_EQ(replay->outcome, Outcome::kCompleted);
    EXPECT_FALSE(replay->cached);
    EXPECT_EQ(replay->record->result, done.result);
    EXPECT_GT(base_->calls, calls);
    EXPECT_EQ(Fallbacks(reason), 1) << reason;
  }
  // A Redis error is never "absent": a new key is still created only once.
  redis_->failure = absl::UnavailableError("reset");
  const RecordKey fresh{"t", "create-payment", "fresh"};
  absl::StatusOr<BeginResult> grant = coordinator_->Begin(fresh, Cmd("h"));
  ASSERT_TRUE(grant.ok());
  EXPECT_EQ(grant->outcome, Outcome::kAcquired);
  absl::StatusOr<BeginResult> second = coordinator_->Begin(fresh, Cmd("h"));
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->outcome, Outcome::kInProgress);
}

TEST_F(RedisStoreTest, BadValuesAreIgnoredDeletedAndReplaced) {
  const Record done = Finish(key_, "paid");
  const RecordKey other_key{"t", "create-payment", "other"};
  Finish(other_key, "someone else's");
  const std::string good = redis_->data[CacheKey(key_)].value;
  std::string flipped = good;
  flipped[flipped.size() / 2] ^= 1;
  Record forged_record = done;
  forged_record.result->body = "forged";
  const std::string other_mac =
      EncodeCacheValue(forged_record, **CacheMac::Create(std::string(32, 'x')));
  for (const auto& [bad, reason] :
       {std::pair{std::string("garbage"), "corrupt"},
        std::pair{flipped, "forged"},
        std::pair{redis_->data[CacheKey(other_key)].value, "forged"},
        std::pair{other_mac, "unknown_key"}}) {
    SCOPED_TRACE(reason);
    const double before = Fallbacks(reason);
    const int dels = redis_->dels;
    redis_->data[CacheKey(key_)].value = bad;
    absl::StatusOr<BeginResult> replay = coordinator_->Begin(key_, Cmd("h"));
    ASSERT_TRUE(replay.ok()) << replay.status();
    EXPECT_EQ(replay->outcome, Outcome::kCompleted);
    EXPECT_FALSE(replay->cached);
    EXPECT_EQ(replay->record->result, done.result);
    EXPECT_EQ(Fallbacks(reason), before + 1);
    EXPECT_EQ(redis_->dels, dels + 1);
    // Deleted, then the read from the store put the right value back.
    EXPECT_TRUE(
        DecodeCacheValue(key_, redis_->data[CacheKey(key_)].value, *mac_).ok());
  }
}

// The MAC does not cover the TTL: a value without one, or one kept past
// its record's expires_at, is not used but deleted.
TEST_F(RedisStoreTest, ValuesWithoutATtlOrPastExpiryAreDeleted) {
  Finish(key_, "paid");
  redis_->data[CacheKey(key_)].ttl = std::nullopt;
  absl::StatusOr<BeginResult> replay = coordinator_->Begin(key_, Cmd("h"));
  ASSERT_TRUE(replay.ok());
  EXPECT_FALSE(replay->cached);
  EXPECT_EQ(Fallbacks("no_ttl"), 1);
  // Refilled with a TTL.
  EXPECT_TRUE(redis_->data[CacheKey(key_)].ttl.has_value());

  // Past expires_at by the clock, with a TTL stretched by hand.
  redis_->data[CacheKey(key_)].ttl = absl::Hours(5);
  now_ += absl::Hours(2);
  replay = coordinator_->Begin(key_, Cmd("h"));
  ASSERT_TRUE(replay.ok());
  EXPECT_FALSE(replay->cached);
  EXPECT_EQ(Fallbacks("expired"), 1);
  EXPECT_EQ(redis_->data.count(CacheKey(key_)), 0u);
}

TEST_F(RedisStoreTest, MissesAreCountedAndFilledFromTheStore) {
  Finish(key_, "paid");
  EXPECT_EQ(Fallbacks("miss"), 1);  // Its first Begin.
  redis_->data.clear();
  absl::StatusOr<BeginResult> replay = coordinator_->Begin(key_, Cmd("h"));
  ASSERT_TRUE(replay.ok());
  EXPECT_FALSE(replay->cached);
  EXPECT_EQ(Fallbacks("miss"), 2);
  // Filled with the time left by the store's clock.
  now_ += absl::Minutes(40);
  redis_->data.clear();
  ASSERT_TRUE(coordinator_->Get(key_).ok());
  ASSERT_EQ(redis_->data.count(CacheKey(key_)), 1u);
  EXPECT_LE(*redis_->data[CacheKey(key_)].ttl, absl::Minutes(20));
  EXPECT_GT(*redis_->data[CacheKey(key_)].ttl,
            absl::Minutes(20) - absl::Seconds(1));
  // Past expires_at nothing is cached.
  now_ += absl::Minutes(21);
  redis_->data.clear();
  ASSERT_TRUE(coordinator_->Get(key_).ok());
  EXPECT_TRUE(redis_->data.empty());
}

TEST_F(RedisStoreTest, PurgeDeletesTheCachedKeys) {
  Finish(key_, "paid");
  ASSERT_EQ(redis_->data.size(), 1u);
  now_ += absl::Hours(2);
  absl::StatusOr<std::vector<RecordKey>> purged = Purge();
  ASSERT_TRUE(purged.ok());
  EXPECT_EQ(purged->size(), 1u);
  EXPECT_TRUE(redis_->data.empty());
  // The record left a tombstone (default policy): EXPIRED, and a tombstone
  // is never cached.
  absl::StatusOr<BeginResult> expired = coordinator_->Begin(key_, Cmd("h"));
  ASSERT_TRUE(expired.ok());
  EXPECT_EQ(expired->outcome, Outcome::kExpired);
  EXPECT_TRUE(redis_->data.empty());
}

TEST_F(RedisStoreTest, ResolveOfAnUnknownRecordWritesThrough) {
  absl::StatusOr<BeginResult> grant = coordinator_->Begin(key_, Cmd("h"));
  ASSERT_TRUE(grant.ok());
  now_ += absl::Minutes(1);  // The 30 s lease ran out.
  absl::StatusOr<Record> unknown = coordinator_->Get(key_);
  ASSERT_TRUE(unknown.ok());
  ASSERT_EQ(unknown->status, Status::kUnknown);
  EXPECT_TRUE(redis_->data.empty());
  ResolveCommand resolve;
  resolve.to = Status::kSucceeded;
  resolve.result = Snapshot{200, "settled", "text/plain", {}};
  resolve.reason = "checked the ledger";
  resolve.actor = "alice";
  ASSERT_TRUE(coordinator_->Resolve(key_, resolve).ok());
  absl::StatusOr<BeginResult> replay = coordinator_->Begin(key_, Cmd("h"));
  ASSERT_TRUE(replay.ok());
  EXPECT_TRUE(replay->cached);
  EXPECT_EQ(replay->outcome, Outcome::kCompleted);
  EXPECT_EQ(replay->record->result->body, "settled");
  EXPECT_EQ(replay->record->resolved_by, "alice");
}

// What BeginFromCacheMany answers for one call.
std::optional<BeginResult> FromCache(Coordinator& c, const RecordKey& key,
                                     const BeginCommand& cmd) {
  std::vector<std::optional<BeginResult>> out =
      c.BeginFromCacheMany({&key}, {&cmd});
  EXPECT_EQ(out.size(), 1u);
  return out.empty() ? std::nullopt : std::move(out[0]);
}

// Expects BeginFromCacheMany to replay `done` from `source`.
void ExpectCachedReplay(Coordinator& c, const RecordKey& key,
                        const Record& done, const char* source) {
  BeginCommand cmd;
  cmd.request_hash = done.request_hash;
  std::optional<BeginResult> replay = FromCache(c, key, cmd);
  ASSERT_TRUE(replay.has_value()) << source;
  EXPECT_EQ(replay->outcome, Outcome::kCompleted);
  EXPECT_STREQ(replay->cache_source, source);
  EXPECT_EQ(replay->record->result, done.result);
}

TEST_F(RedisStoreTest, BeginFromCacheManyAnswersReplaysFromRedis) {
  const Record done = Finish(key_, "paid");
  const int calls = base_->calls;
  const int gets = redis_->gets;
  ExpectCachedReplay(*coordinator_, key_, done, "redis");
  std::optional<BeginResult> other =
      FromCache(*coordinator_, key_, Cmd("other"));
  ASSERT_TRUE(other.has_value());
  EXPECT_EQ(other->outcome, Outcome::kMismatch);
  EXPECT_EQ(redis_->gets, gets + 2);
  EXPECT_EQ(base_->calls, calls);
}

// Several calls share one GetMany, and each gets its own key's answer.
TEST_F(RedisStoreTest, BeginFromCacheManyAnswersEachCallInOrder) {
  RecordKey paid = key_, refunded = key_, absent = key_;
  paid.key = "paid";
  refunded.key = "refunded";
  absent.key = "absent";
  const Record paid_done = Finish(paid, "paid");
  const Record refunded_done = Finish(refunded, "refunded");
  const int calls = base_->calls;
  const int gets = redis_->gets;
  const BeginCommand h = Cmd("h");
  std::vector<std::optional<BeginResult>> out =
      coordinator_->BeginFromCacheMany({&refunded, &absent, &paid, &refunded},
                                       {&h, &h, &h, &h});
  ASSERT_EQ(out.size(), 4u);
  ASSERT_TRUE(out[0].has_value());
  EXPECT_EQ(out[0]->record->key.key, "refunded");
  EXPECT_EQ(out[0]->record->result, refunded_done.result);
  EXPECT_FALSE(out[1].has_value());
  ASSERT_TRUE(out[2].has_value());
  EXPECT_EQ(out[2]->record->key.key, "paid");
  EXPECT_EQ(out[2]->record->result, paid_done.result);
  ASSERT_TRUE(out[3].has_value());
  EXPECT_EQ(out[3]->record->key.key, "refunded");
  EXPECT_EQ(redis_->gets, gets + 4);
  EXPECT_EQ(base_->calls, calls);
}

TEST_F(RedisStoreTest, BeginFromCacheManyLeavesMissesAndFailuresToBegin) {
  // Nothing cached: the caller must run Begin, which acquires.
  EXPECT_FALSE(FromCache(*coordinator_, key_, Cmd("h")).has_value());
  absl::StatusOr<BeginResult> grant =
      coordinator_->Begin(key_, Cmd("h"), /*cache_checked=*/true);
  ASSERT_TRUE(grant.ok()) << grant.status();
  EXPECT_EQ(grant->outcome, Outcome::kAcquired);
  // PROCESSING records are never cached.
  EXPECT_FALSE(FromCache(*coordinator_, key_, Cmd("h")).has_value());
  CompleteCommand complete;
  complete.fencing_token = grant->record->fencing_token;
  complete.result.code = 200;
  ASSERT_TRUE(coordinator_->Complete(key_, complete).ok());
  // Redis down: no answer from the cache, never a wrong one.
  redis_->failure = absl::UnavailableError("redis down");
  EXPECT_FALSE(FromCache(*coordinator_, key_, Cmd("h")).has_value());
  EXPECT_GE(Fallbacks("error"), 1);
}

// The in-process cache in front of the Redis decorator, as the sidecar
// stacks them.
class LocalCacheTest : public RedisStoreTest {
 protected:
  LocalCacheTest() {
    local_cache_ = NewLocalCacheStore(store_, LocalCacheOptions{});
    store_ = local_cache_.get();
    coordinator_ =
        std::make_unique<SyncCoordinator>(store_, &policies_, &metrics_);
  }

  // The chain of another instance: an empty store and in-process cache,
  // and a copy of this Redis (what only Redis has).
  struct Instance {
    std::unique_ptr<Store> store;
    std::unique_ptr<RecordStore> redis;
    std::unique_ptr<RecordStore> local;
  };
  Instance OtherInstance() {
    Instance other;
    other.store = NewMemoryStore([this] { return now_; });
    other.redis = NewRedisCacheStore(other.store.get(), redis_->Copy(), mac_,
                                     &metrics_, [this] { return now_; });
    other.local = NewLocalCacheStore(other.redis.get(), LocalCacheOptions{});
    return other;
  }
};

TEST_F(LocalCacheTest, ReplaysAfterCompleteComeFromMemory) {
  const Record done = Finish(key_, "paid");
  const int gets = redis_->gets;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<BeginResult> replay = coordinator_->Begin(key_, Cmd("h"));
    ASSERT_TRUE(replay.ok());
    EXPECT_EQ(replay->outcome, Outcome::kCompleted);
    ASSERT_TRUE(replay->cached);
    EXPECT_STREQ(replay->cache_source, "memory");
    EXPECT_EQ(replay->record->result, done.result);
  }
  absl::StatusOr<BeginResult> mismatch = coordinator_->Begin(key_, Cmd("x"));
  ASSERT_TRUE(mismatch.ok());
  EXPECT_EQ(mismatch->outcome, Outcome::kMismatch);
  EXPECT_EQ(redis_->gets, gets);
}

TEST_F(LocalCacheTest, RedisHitsAreKeptInMemory) {
  const Record done = Finish(key_, "paid");
  const Instance other = OtherInstance();
  SyncCoordinator remote(other.local.get(), &policies_, &metrics_);
  absl::StatusOr<BeginResult> first = remote.Begin(key_, Cmd("h"));
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(first->cached);
  EXPECT_STREQ(first->cache_source, "redis");
  absl::StatusOr<BeginResult> second = remote.Begin(key_, Cmd("h"));
  ASSERT_TRUE(second.ok());
  ASSERT_TRUE(second->cached);
  EXPECT_STREQ(second->cache_source, "memory");
  EXPECT_EQ(second->record->result, done.result);
}

TEST_F(LocalCacheTest, BeginFromCacheManyAnswersFromMemory) {
  const Record done = Finish(key_, "paid");
  const int gets = redis_->gets;
  ExpectCachedReplay(*coordinator_, key_, done, "memory");
  EXPECT_EQ(redis_->gets, gets);
}

TEST_F(LocalCacheTest, BeginFromCacheManyKeepsRedisHitsInMemory) {
  const Record done = Finish(key_, "paid");
  const Instance other = OtherInstance();
  SyncCoordinator remote(other.local.get(), &policies_, &metrics_);
  ExpectCachedReplay(remote, key_, done, "redis");
  ExpectCachedReplay(remote, key_, done, "memory");
}

// In one batch, what memory holds comes from memory and the rest from Redis.
TEST_F(LocalCacheTest, BeginFromCacheManyAsksRedisForWhatMemoryLacks) {
  RecordKey other_key = key_;
  other_key.key = "other";
  Finish(key_, "paid");
  Finish(other_key, "refunded");
  const Instance other = OtherInstance();
  SyncCoordinator remote(other.local.get(), &policies_, &metrics_);
  const BeginCommand h = Cmd("h");
  ASSERT_TRUE(FromCache(remote, key_, h).has_value());
  std::vector<std::optional<BeginResult>> out =
      remote.BeginFromCacheMany({&other_key, &key_}, {&h, &h});
  ASSERT_EQ(out.size(), 2u);
  ASSERT_TRUE(out[0].has_value());
  ASSERT_TRUE(out[1].has_value());
  EXPECT_STREQ(out[0]->cache_source, "redis");
  EXPECT_EQ(out[0]->record->result->body, "refunded");
  EXPECT_STREQ(out[1]->cache_source, "memory");
  EXPECT_EQ(out[1]->record->result->body, "paid");
}

// Replays from memory share the kept record rather than copy it, and an
// answer outlives the entry it came from.
TEST_F(LocalCacheTest, ReplaysShareTheKeptRecord) {
  const Record done = Finish(key_, "paid");
  absl::StatusOr<BeginResult> first = coordinator_->Begin(key_, Cmd("h"));
  absl::StatusOr<BeginResult> second = coordinator_->Begin(key_, Cmd("h"));
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(second.ok());
  ASSERT_STREQ(second->cache_source, "memory");
  EXPECT_EQ(first->record.get(), second->record.get());
  now_ += absl::Hours(2);
  absl::StatusOr<std::vector<RecordKey>> purged = Purge();
  ASSERT_TRUE(purged.ok());
  ASSERT_EQ(purged->size(), 1u);
  EXPECT_EQ(second->record->result, done.result);
}

TEST_F(LocalCacheTest, RetryableFailuresAreNotKept) {
  absl::StatusOr<BeginResult> grant = coordinator_->Begin(key_, Cmd("h"));
  ASSERT_TRUE(grant.ok());
  FailCommand fail;
  fail.fencing_token = grant->record->fencing_token;
  fail.error.code = 503;
  fail.retryable = true;
  ASSERT_TRUE(coordinator_->Fail(key_, fail).ok());
  absl::StatusOr<BeginResult> again = coordinator_->Begin(key_, Cmd("h"));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->outcome, Outcome::kAcquired);
  EXPECT_FALSE(again->cached);
}

TEST_F(LocalCacheTest, PurgeDropsTheKeptRecords) {
  Finish(key_, "paid");
  now_ += absl::Hours(2);
  absl::StatusOr<std::vector<RecordKey>> purged = Purge();
  ASSERT_TRUE(purged.ok());
  ASSERT_EQ(purged->size(), 1u);
  // Only the store knows the record is a tombstone now: EXPIRED.
  absl::StatusOr<BeginResult> expired = coordinator_->Begin(key_, Cmd("h"));
  ASSERT_TRUE(expired.ok());
  EXPECT_EQ(expired->outcome, Outcome::kExpired);
  EXPECT_FALSE(expired->cached);
}

}  // namespace
}  // namespace idem
