// The Redis cache end to end: two real sidecars over one PostgreSQL and one
// real redis-server. Replays come from Redis (even with PostgreSQL stopped),
// bad values never produce a wrong replay, entries never outlive their
// records, and killing, pausing or flushing Redis under load changes no
// answer (G3, G4) and only briefly the latency.
#include <hiredis/hiredis.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <fstream>
#include <iostream>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "tests/sidecar_env.h"
#include "tests/testing/files.h"
#include "tests/testing/process.h"

namespace idem::testing {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using Serving = grpc::health::v1::HealthCheckResponse;

SidecarEnv* env = nullptr;

constexpr char kConfig[] = R"yaml(
operations:
  ephemeral: {retention: 2s, tombstone_retention: 0s}
)yaml";

// These sidecars run without the in-process cache (--local-cache-mib=0),
// which would otherwise answer the replays these tests want from Redis;
// InProcessCache... runs its own sidecar with it.
const auto* const kEnv = ::testing::AddGlobalTestEnvironment(
    new SharedSidecarEnv(&env, 2,
                         {"--purge-interval=200ms", "--reaper-interval=200ms",
                          "--local-cache-mib=0"},
                         kConfig, SidecarEnvOptions{/*redis=*/true, {}}));

// Polls `done` every 50 ms until it holds or `timeout` passes.
template <typename Fn>
bool WaitFor(Fn done, absl::Duration timeout = absl::Seconds(10)) {
  const absl::Time end = absl::Now() + timeout;
  while (absl::Now() < end) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return done();
}

std::string RedisKey(const pb::RecordKey& k) {
  return absl::StrCat("idem:{", k.tenant().size(), ":", k.tenant(),
                      k.operation().size(), ":", k.operation(), k.key().size(),
                      ":", k.key(), "}");
}

// The CRC-32C (Castagnoli) of `data`, bit by bit: the checksum of the
// previous ("IDC1") envelope.
uint32_t Crc32c(const std::string& data) {
  uint32_t c = 0xFFFFFFFFu;
  for (char ch : data) {
    c ^= static_cast<unsigned char>(ch);
    for (int bit = 0; bit < 8; ++bit) {
      c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    }
  }
  return c ^ 0xFFFFFFFFu;
}

// Runs one command on `port`'s Redis, binary-safe (redis-cli's output
// loses trailing newlines); returns a string or status reply, or "" (also on
// any error).
std::string RawRedis(int port, const std::vector<std::string>& args) {
  timeval tv{5, 0};
  redisContext* c = redisConnectWithTimeout("127.0.0.1", port, tv);
  std::string out;
  if (c != nullptr && c->err == 0) {
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const std::string& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    auto* reply = static_cast<redisReply*>(redisCommandArgv(
        c, static_cast<int>(args.size()), argv.data(), lens.data()));
    if (reply != nullptr && (reply->type == REDIS_REPLY_STRING ||
                             reply->type == REDIS_REPLY_STATUS)) {
      out.assign(reply->str, reply->len);
    }
    if (reply != nullptr) freeReplyObject(reply);
  }
  if (c != nullptr) redisFree(c);
  return out;
}

// Writes `text` to a new file in the test's temporary directory; returns its
// path.
std::string WriteKeyFile(const std::string& name, const std::string& text) {
  std::string path =
      absl::StrCat(::testing::TempDir(), "/idem-", getpid(), "-", name);
  std::ofstream(path, std::ios::trunc) << text;
  return path;
}

class RedisTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(env, nullptr) << "environment did not start";
    tenant_ = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    for (int i = 0; i < env->size(); ++i) {
      ASSERT_TRUE(WaitFor([&] { return Metric(i, "idem_redis_up") == 1; }))
          << env->sidecar(i).Log();
    }
  }

  // Leaves Redis and PostgreSQL running for the next test, whatever this one
  // did to them.
  void TearDown() override {
    if (env == nullptr) return;
    env->redis().Resume().IgnoreError();
    if (!env->redis().Ping().ok()) {
      EXPECT_TRUE(env->redis().StartAgain().ok());
    }
    if (!env->pg().Ready(absl::Seconds(1))) {
      EXPECT_TRUE(env->pg().StartAgain().ok());
    }
    for (int i = 0; i < env->size(); ++i) {
      EXPECT_TRUE(
          WaitForHealth(env->health(i), Serving::SERVING, absl::Seconds(10)));
    }
  }

  pb::RecordKey K(const std::string& key,
                  const std::string& op = "create-payment") {
    return Key(tenant_, op, key);
  }

  static grpc::Status Begin(int i, const pb::RecordKey& key,
                            const std::string& hash, pb::BeginResponse* resp,
                            absl::Duration lease = absl::ZeroDuration()) {
    pb::BeginRequest req;
    *req.mutable_key() = key;
    req.set_request_hash(hash);
    if (lease > absl::ZeroDuration()) {
      req.mutable_lease()->set_seconds(absl::ToInt64Seconds(lease));
    }
    return env->client(i).Begin(Ctx(absl::Seconds(5)).get(), req, resp);
  }

  static grpc::Status Get(int i, const pb::RecordKey& key, pb::Record* out) {
    pb::GetRequest req;
    *req.mutable_key() = key;
    pb::GetResponse resp;
    grpc::Status s =
        env->client(i).Get(Ctx(absl::Seconds(5)).get(), req, &resp);
    *out = resp.record();
    return s;
  }

  // Begins and completes `key` with a BinarySnapshot tagged `tag`; returns
  // the record as PostgreSQL committed it.
  static pb::Record Finish(int i, const pb::RecordKey& key,
                           const std::string& tag) {
    pb::BeginResponse grant;
    grpc::Status s = Begin(i, key, "hash-1", &grant);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(grant.outcome(), pb::OUTCOME_ACQUIRED);
    pb::CompleteRequest req;
    *req.mutable_key() = key;
    req.set_fencing_token(grant.fencing_token());
    *req.mutable_result() = BinarySnapshot(201, tag);
    pb::CompleteResponse resp;
    s = env->client(i).Complete(Ctx().get(), req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.record();
  }

  // Begins and fails `key` (not retryable unless asked); returns the record.
  static pb::Record FailIt(int i, const pb::RecordKey& key,
                           const std::string& tag, bool retryable = false) {
    pb::BeginResponse grant;
    grpc::Status s = Begin(i, key, "hash-1", &grant);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(grant.outcome(), pb::OUTCOME_ACQUIRED);
    pb::FailRequest req;
    *req.mutable_key() = key;
    req.set_fencing_token(grant.fencing_token());
    *req.mutable_error() = BinarySnapshot(402, tag);
    req.set_retryable(retryable);
    pb::FailResponse resp;
    s = env->client(i).Fail(Ctx().get(), req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.record();
  }

  static double Metric(int i, const std::string& series) {
    absl::StatusOr<std::string> text =
        HttpGet(env->sidecar(i).metrics_port(), "/metrics");
    if (!text.ok()) return -1;
    return std::max(0.0, MetricValue(*text, series));
  }

  static double RedisReplays(int i) {
    return Metric(i, "idem_replay_total{source=\"redis\"}");
  }
  static double Fallbacks(int i, const std::string& reason) {
    return Metric(
        i, absl::StrCat("idem_redis_fallback_total{reason=\"", reason, "\"}"));
  }

  // The mean of idem_store_duration_seconds{store, op} on sidecar `i`.
  static absl::Duration StoreMean(int i, const std::string& store,
                                  const std::string& op) {
    absl::StatusOr<std::string> text =
        HttpGet(env->sidecar(i).metrics_port(), "/metrics");
    if (!text.ok()) return absl::ZeroDuration();
    double sum = 0, count = 0;
    for (absl::string_view line : absl::StrSplit(*text, '\n')) {
      if (!absl::StrContains(line, absl::StrCat("store=\"", store, "\"")) ||
          !absl::StrContains(line, absl::StrCat("op=\"", op, "\""))) {
        continue;
      }
      double* out =
          absl::StartsWith(line, "idem_store_duration_seconds_sum{") ? &sum
          : absl::StartsWith(line, "idem_store_duration_seconds_count{")
              ? &count
              : nullptr;
      if (out != nullptr &&
          !absl::SimpleAtod(line.substr(line.rfind(' ') + 1), out)) {
        return absl::ZeroDuration();
      }
    }
    return count > 0 ? absl::Seconds(sum / count) : absl::ZeroDuration();
  }

  static std::string Cli(const std::vector<std::string>& args) {
    absl::StatusOr<std::string> out = env->redis().Cli(args);
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? *out : "";
  }

  // How often `needle` occurs in sidecar `i`'s log.
  // Lines of sidecar `i`'s log with `needle`, but not `unless` if given.
  static int LogCount(int i, const std::string& needle,
                      const std::string& unless = "") {
    int n = 0;
    for (absl::string_view line : absl::StrSplit(env->sidecar(i).Log(), '\n')) {
      if (absl::StrContains(line, needle) &&
          (unless.empty() || !absl::StrContains(line, unless))) {
        ++n;
      }
    }
    return n;
  }

  std::string tenant_;
};

TEST_F(RedisTest, ReplaysComeFromRedisWhilePostgresIsStopped) {
  const pb::RecordKey paid = K("paid");
  const pb::RecordKey declined = K("declined");
  const pb::Record paid_record = Finish(0, paid, "paid");
  const pb::Record declined_record = FailIt(1, declined, "declined");
  EXPECT_EQ(Cli({"EXISTS", RedisKey(paid)}), "1");
  EXPECT_EQ(Cli({"EXISTS", RedisKey(declined)}), "1");
  const std::array<double, 2> before = {RedisReplays(0), RedisReplays(1)};

  ASSERT_TRUE(env->pg().Stop().ok());
  for (int i = 0; i < env->size(); ++i) {
    pb::BeginResponse resp;
    grpc::Status s = Begin(i, paid, "hash-1", &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(resp.outcome(), pb::OUTCOME_COMPLETED);
    EXPECT_TRUE(MessageDifferencer::Equals(resp.record(), paid_record));

    resp.Clear();
    s = Begin(i, declined, "hash-1", &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(resp.outcome(), pb::OUTCOME_FAILED);
    EXPECT_TRUE(MessageDifferencer::Equals(resp.record(), declined_record));

    resp.Clear();
    s = Begin(i, paid, "hash-2", &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(resp.outcome(), pb::OUTCOME_MISMATCH);
    EXPECT_FALSE(resp.record().has_result());

    pb::Record got;
    s = Get(i, paid, &got);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_TRUE(MessageDifferencer::Equals(got, paid_record));

    // Redis never grants: a new key needs PostgreSQL.
    resp.Clear();
    s = Begin(i, K(absl::StrCat("new-", i)), "hash-1", &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE)
        << s.error_message();
    EXPECT_NE(resp.outcome(), pb::OUTCOME_ACQUIRED);
    EXPECT_EQ(RedisReplays(i), before[i] + 2);
  }
  ASSERT_TRUE(env->pg().StartAgain().ok());
}

// Requests and responses live on per-call arenas whose first block is
// 4 KiB, and a cached value is parsed on a 2 KiB one on the stack: a result
// far larger than both, with many headers (a map field), replays from Redis
// on every instance exactly as PostgreSQL committed it.
TEST_F(RedisTest, LargeResultsReplayExactlyFromRedis) {
  const pb::RecordKey key = K("large");
  pb::BeginResponse grant;
  grpc::Status s = Begin(0, key, "hash-1", &grant);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(grant.outcome(), pb::OUTCOME_ACQUIRED);
  pb::CompleteRequest req;
  *req.mutable_key() = key;
  req.set_fencing_token(grant.fencing_token());
  pb::Snapshot* result = req.mutable_result();
  result->set_code(200);
  result->set_content_type("application/octet-stream");
  std::string body;
  for (int i = 0; i < 100 * 1024; ++i) body.push_back(static_cast<char>(i));
  result->set_body(body);
  for (int i = 0; i < 40; ++i) {
    (*result->mutable_headers())[absl::StrCat("x-header-", i)] =
        std::string(100, static_cast<char>('a' + i % 26));
  }
  pb::CompleteResponse done;
  s = env->client(0).Complete(Ctx().get(), req, &done);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_TRUE(MessageDifferencer::Equals(done.record().result(), *result));
  EXPECT_EQ(Cli({"EXISTS", RedisKey(key)}), "1");
  for (int i = 0; i < env->size(); ++i) {
    const double before = RedisReplays(i);
    pb::BeginResponse replay;
    s = Begin(i, key, "hash-1", &replay);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(replay.outcome(), pb::OUTCOME_COMPLETED);
    EXPECT_TRUE(MessageDifferencer::Equals(replay.record(), done.record()))
        << "sidecar " << i;
    EXPECT_EQ(RedisReplays(i), before + 1) << "sidecar " << i;
  }
}

// Completes that commit in one batch have their SETs pipelined together:
// each record is in Redis, under its own key with its own result, when its
// Complete returns, and the other instance replays each from Redis. Its own
// two sidecars have a Redis timeout that a slow (sanitized) build does not
// reach: the claim is about fills Redis answers, not about the 5 ms default,
// past which a fill is skipped by design.
TEST_F(RedisTest, ConcurrentCompletesAreEachInRedisWhenTheyReturn) {
  std::vector<std::unique_ptr<SidecarProcess>> sidecars;
  std::vector<std::unique_ptr<pb::Idempotency::Stub>> stubs;
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<std::unique_ptr<SidecarProcess>> s = SidecarProcess::Start(
        IDEM_SIDECAR_PATH,
        {"--postgres=" + env->pg().ConnInfo(),
         "--redis=" + env->redis().Address(), env->RedisMacKeyFlag(),
         "--local-cache-mib=0", "--redis-timeout=1s"});
    ASSERT_TRUE(s.ok()) << s.status();
    stubs.push_back(pb::Idempotency::NewStub(grpc::CreateChannel(
        (*s)->Address(), grpc::InsecureChannelCredentials())));
    sidecars.push_back(*std::move(s));
  }
  auto metric = [&](int i, const std::string& series) {
    absl::StatusOr<std::string> text =
        HttpGet(sidecars[i]->metrics_port(), "/metrics");
    return text.ok() ? std::max(0.0, MetricValue(*text, series)) : -1.0;
  };
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(WaitFor([&] { return metric(i, "idem_redis_up") == 1; }))
        << sidecars[i]->Log();
  }
  auto begin = [&](int i, const pb::RecordKey& key, pb::BeginResponse* resp) {
    pb::BeginRequest req;
    *req.mutable_key() = key;
    req.set_request_hash("hash-1");
    return stubs[i]->Begin(Ctx(absl::Seconds(5)).get(), req, resp);
  };
  constexpr int kCalls = 32;
  std::vector<pb::RecordKey> keys;
  keys.reserve(kCalls);
  for (int i = 0; i < kCalls; ++i) keys.push_back(K(absl::StrCat("batch-", i)));
  std::vector<pb::Record> done(kCalls);
  std::vector<std::string> cached(kCalls);
  std::vector<std::thread> threads;
  threads.reserve(kCalls);
  for (int i = 0; i < kCalls; ++i) {
    threads.emplace_back([&, i] {
      pb::BeginResponse grant;
      grpc::Status s = begin(0, keys[i], &grant);
      EXPECT_TRUE(s.ok()) << s.error_message();
      EXPECT_EQ(grant.outcome(), pb::OUTCOME_ACQUIRED);
      pb::CompleteRequest req;
      *req.mutable_key() = keys[i];
      req.set_fencing_token(grant.fencing_token());
      *req.mutable_result() = BinarySnapshot(201, absl::StrCat("result ", i));
      pb::CompleteResponse resp;
      s = stubs[0]->Complete(Ctx().get(), req, &resp);
      EXPECT_TRUE(s.ok()) << s.error_message();
      done[i] = resp.record();
      cached[i] = Cli({"EXISTS", RedisKey(keys[i])});
    });
  }
  for (std::thread& t : threads) t.join();
  const std::string replays = "idem_replay_total{source=\"redis\"}";
  const double before = metric(1, replays);
  for (int i = 0; i < kCalls; ++i) {
    EXPECT_EQ(cached[i], "1") << "call " << i;
    pb::BeginResponse replay;
    grpc::Status s = begin(1, keys[i], &replay);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(replay.outcome(), pb::OUTCOME_COMPLETED);
    EXPECT_TRUE(MessageDifferencer::Equals(replay.record(), done[i]))
        << "call " << i;
  }
  EXPECT_EQ(metric(1, replays), before + kCalls);
}

TEST_F(RedisTest, BadValuesNeverProduceAWrongReplay) {
  const pb::RecordKey a = K("a");
  const pb::RecordKey b = K("b");
  const pb::Record a_record = Finish(0, a, "A");
  Finish(0, b, "B");
  auto replay_of_a = [&](int i) {
    pb::BeginResponse resp;
    grpc::Status s = Begin(i, a, "hash-1", &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(resp.outcome(), pb::OUTCOME_COMPLETED);
    EXPECT_TRUE(MessageDifferencer::Equals(resp.record(), a_record))
        << resp.record().result().headers().at("x-tag");
  };
  // Not an envelope; a flipped byte inside a good one; b's intact value.
  const std::vector<std::vector<std::string>> spoil = {
      {"SET", RedisKey(a), "not a cached record"},
      {"SETRANGE", RedisKey(a), "40", "X"},
      {"COPY", RedisKey(b), RedisKey(a), "REPLACE"},
  };
  const std::vector<std::string> reasons = {"corrupt", "forged", "forged"};
  for (size_t i = 0; i < spoil.size(); ++i) {
    const std::vector<std::string>& cmd = spoil[i];
    SCOPED_TRACE(cmd[0]);
    const double bad = Fallbacks(0, reasons[i]);
    const double redis = RedisReplays(0);
    Cli(cmd);
    replay_of_a(0);  // From PostgreSQL, which puts the right value back.
    EXPECT_EQ(Fallbacks(0, reasons[i]), bad + 1);
    EXPECT_EQ(RedisReplays(0), redis);
    replay_of_a(0);  // From Redis again.
    EXPECT_EQ(RedisReplays(0), redis + 1);
  }
  // With nothing but another record's value to go on, there is no answer.
  Cli({"COPY", RedisKey(b), RedisKey(a), "REPLACE"});
  ASSERT_TRUE(env->pg().Stop().ok());
  pb::BeginResponse resp;
  grpc::Status s = Begin(1, a, "hash-1", &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  pb::Record got;
  s = Get(1, a, &got);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  ASSERT_TRUE(env->pg().StartAgain().ok());
}

// Whoever can write to Redis cannot make a sidecar replay a record
// PostgreSQL does not hold: neither with the previous version's envelope
// (a CRC-32C, no MAC) nor with a signed envelope moved to another key.
// Each is ignored, counted and deleted; Begin acquires the key.
TEST_F(RedisTest, ForgedValuesAreIgnoredAndDeleted) {
  const pb::Record real = Finish(0, K("real"), "real");
  const std::string signed_value =
      RawRedis(env->redis().port(), {"GET", RedisKey(K("real"))});
  ASSERT_GT(signed_value.size(), 40u);
  struct Case {
    std::string name;
    std::string reason;
    std::string value;
  };
  std::vector<Case> cases;
  pb::Record forged = real;
  *forged.mutable_key() = K("forged-idc1");
  const std::string payload = forged.SerializeAsString();
  std::string idc1 = "IDC1";
  const uint32_t crc = Crc32c(payload);
  for (int i = 0; i < 4; ++i) idc1.push_back(static_cast<char>(crc >> (8 * i)));
  cases.push_back({"forged-idc1", "corrupt", idc1 + payload});
  *forged.mutable_key() = K("forged-mac");
  cases.push_back({"forged-mac", "forged",
                   signed_value.substr(0, 40) + forged.SerializeAsString()});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const pb::RecordKey key = K(c.name);
    const double before = Fallbacks(0, c.reason);
    const double replays = RedisReplays(0);
    ASSERT_EQ(RawRedis(env->redis().port(),
                       {"SET", RedisKey(key), c.value, "PX", "600000"}),
              "OK");
    pb::BeginResponse resp;
    grpc::Status st = Begin(0, key, "hash-1", &resp);
    ASSERT_TRUE(st.ok()) << st.error_message();
    EXPECT_EQ(resp.outcome(), pb::OUTCOME_ACQUIRED);
    EXPECT_EQ(Fallbacks(0, c.reason), before + 1);
    EXPECT_EQ(RedisReplays(0), replays);
    EXPECT_EQ(Cli({"EXISTS", RedisKey(key)}), "0");
  }
  EXPECT_GE(LogCount(0, "ignored and deleted a bad redis value"), 1);
}

// The MAC does not cover the TTL: a signed value made to live for ever
// (PERSIST), or kept past its record's expires_at, is not used.
TEST_F(RedisTest, ValuesWithoutATtlOrPastExpiryAreIgnoredAndDeleted) {
  const pb::RecordKey key = K("persisted");
  Finish(0, key, "persisted");
  ASSERT_EQ(Cli({"PERSIST", RedisKey(key)}), "1");
  // PostgreSQL forgets the record: only Redis still has it.
  env->Sql(absl::StrCat("DELETE FROM idempotency_record WHERE tenant_id = '",
                        tenant_, "' AND idempotency_key = 'persisted'"));
  const double no_ttl = Fallbacks(0, "no_ttl");
  const double replays = RedisReplays(0);
  pb::BeginResponse resp;
  ASSERT_TRUE(Begin(0, key, "hash-1", &resp).ok());
  EXPECT_EQ(resp.outcome(), pb::OUTCOME_ACQUIRED);
  EXPECT_EQ(Fallbacks(0, "no_ttl"), no_ttl + 1);
  EXPECT_EQ(RedisReplays(0), replays);
  EXPECT_EQ(Cli({"EXISTS", RedisKey(key)}), "0");

  // Retention 2s; once the record is purged, its value is put back with a
  // long TTL.
  const pb::RecordKey brief = K("stretched", "ephemeral");
  const pb::Record done = Finish(1, brief, "brief");
  const std::string value =
      RawRedis(env->redis().port(), {"GET", RedisKey(brief)});
  ASSERT_GT(value.size(), 40u);
  ASSERT_TRUE(WaitFor([&] {
    return env->Sql(absl::StrCat(
               "SELECT count(*) FROM idempotency_record WHERE tenant_id = '",
               tenant_, "' AND idempotency_key = 'stretched'")) == "0";
  }));
  ASSERT_TRUE(WaitFor([&] { return Cli({"EXISTS", RedisKey(brief)}) == "0"; }));
  ASSERT_EQ(RawRedis(env->redis().port(),
                     {"SET", RedisKey(brief), value, "PX", "600000"}),
            "OK");
  const double expired = Fallbacks(1, "expired");
  ASSERT_TRUE(Begin(1, brief, "hash-1", &resp).ok());
  EXPECT_EQ(resp.outcome(), pb::OUTCOME_ACQUIRED);
  // A lookup past --redis-timeout (5 ms) on a loaded machine falls through
  // without judging the value, and may open the breaker for a while (a CI
  // run saw it): a later Begin looks again. The stale value is never
  // replayed.
  for (int i = 0; i < 30 && Fallbacks(1, "expired") == expired; ++i) {
    absl::SleepFor(absl::Milliseconds(100));
    ASSERT_TRUE(Begin(1, brief, "hash-1", &resp).ok());
    EXPECT_EQ(resp.outcome(), pb::OUTCOME_IN_PROGRESS);
  }
  EXPECT_EQ(Fallbacks(1, "expired"), expired + 1);
  EXPECT_EQ(Cli({"EXISTS", RedisKey(brief)}), "0");
}

// Tenant and operation may contain ':': identities whose parts join alike
// still have an entry each, and both replay from Redis.
TEST_F(RedisTest, IdentitiesThatJoinAlikeHaveAnEntryEach) {
  const pb::RecordKey a = Key(tenant_ + ":x", "y", "k");
  const pb::RecordKey b = Key(tenant_, "x:y", "k");
  ASSERT_NE(RedisKey(a), RedisKey(b));
  const pb::Record a_done = Finish(0, a, "a");
  const pb::Record b_done = Finish(0, b, "b");
  EXPECT_EQ(Cli({"EXISTS", RedisKey(a)}), "1");
  EXPECT_EQ(Cli({"EXISTS", RedisKey(b)}), "1");
  const double replays = RedisReplays(1);
  const double forged = Fallbacks(1, "forged");
  const double corrupt = Fallbacks(1, "corrupt");
  for (const auto& [key, done] : {std::pair{a, a_done}, std::pair{b, b_done}}) {
    pb::BeginResponse resp;
    ASSERT_TRUE(Begin(1, key, "hash-1", &resp).ok());
    EXPECT_EQ(resp.outcome(), pb::OUTCOME_COMPLETED);
    EXPECT_TRUE(MessageDifferencer::Equals(resp.record(), done));
  }
  EXPECT_EQ(RedisReplays(1), replays + 2);
  EXPECT_EQ(Fallbacks(1, "forged"), forged);
  EXPECT_EQ(Fallbacks(1, "corrupt"), corrupt);
}

// Rotation (docs/redis.md): values signed with K1 are still served by an
// instance with K2 current and K1 previous, and refused (unknown_key) once
// K1 is dropped.
TEST_F(RedisTest, RotatedKeysServeOldValuesUntilDropped) {
  const std::string k1 =
      WriteKeyFile("k1", "rotation-key-one-0123456789abcdef\n");
  const std::string k2 =
      WriteKeyFile("k2", "rotation-key-two-0123456789abcdef\n");
  auto start = [&](const std::vector<std::string>& keys) {
    std::vector<std::string> args = {"--postgres=" + env->pg().ConnInfo(),
                                     "--redis=" + env->redis().Address(),
                                     "--local-cache-mib=0",
                                     "--redis-timeout=1s"};
    args.insert(args.end(), keys.begin(), keys.end());
    absl::StatusOr<std::unique_ptr<SidecarProcess>> s =
        SidecarProcess::Start(IDEM_SIDECAR_PATH, args);
    EXPECT_TRUE(s.ok()) << s.status();
    if (s.ok()) {
      EXPECT_TRUE(WaitFor([&] {
        absl::StatusOr<std::string> m =
            HttpGet((*s)->metrics_port(), "/metrics");
        return m.ok() && MetricValue(*m, "idem_redis_up") == 1;
      })) << (*s)->Log();
    }
    return s.ok() ? *std::move(s) : nullptr;
  };
  auto begin = [](SidecarProcess& s, const pb::RecordKey& key,
                  pb::BeginResponse* resp) {
    pb::BeginRequest req;
    *req.mutable_key() = key;
    req.set_request_hash("hash-1");
    return pb::Idempotency::NewStub(
               grpc::CreateChannel(s.Address(),
                                   grpc::InsecureChannelCredentials()))
        ->Begin(Ctx().get(), req, resp);
  };
  auto metric = [](SidecarProcess& s, const std::string& series) {
    absl::StatusOr<std::string> m = HttpGet(s.metrics_port(), "/metrics");
    return m.ok() ? std::max(0.0, MetricValue(*m, series)) : -1.0;
  };
  const std::string replays = "idem_replay_total{source=\"redis\"}";
  const pb::RecordKey key = K("rotated");

  std::unique_ptr<SidecarProcess> s = start({"--redis-mac-key-file=" + k1});
  ASSERT_NE(s, nullptr);
  pb::BeginResponse grant;
  ASSERT_TRUE(begin(*s, key, &grant).ok());
  ASSERT_EQ(grant.outcome(), pb::OUTCOME_ACQUIRED);
  pb::CompleteRequest complete;
  *complete.mutable_key() = key;
  complete.set_fencing_token(grant.fencing_token());
  *complete.mutable_result() = BinarySnapshot(201, "rotated");
  pb::CompleteResponse done;
  ASSERT_TRUE(
      pb::Idempotency::NewStub(
          grpc::CreateChannel(s->Address(), grpc::InsecureChannelCredentials()))
          ->Complete(Ctx().get(), complete, &done)
          .ok());
  const std::string by_k1 =
      RawRedis(env->redis().port(), {"GET", RedisKey(key)});
  ASSERT_GT(by_k1.size(), 40u);
  s.reset();

  // K2 current, K1 previous: the K1 value is served from Redis.
  s = start(
      {"--redis-mac-key-file=" + k2, "--redis-mac-previous-key-file=" + k1});
  ASSERT_NE(s, nullptr);
  pb::BeginResponse replay;
  ASSERT_TRUE(begin(*s, key, &replay).ok());
  EXPECT_EQ(replay.outcome(), pb::OUTCOME_COMPLETED);
  EXPECT_TRUE(MessageDifferencer::Equals(replay.record(), done.record()));
  EXPECT_EQ(metric(*s, replays), 1);
  EXPECT_EQ(RawRedis(env->redis().port(), {"GET", RedisKey(key)}), by_k1);
  s.reset();

  // K2 alone: the K1 value is refused, deleted, and refilled signed by K2.
  s = start({"--redis-mac-key-file=" + k2});
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(begin(*s, key, &replay).ok());
  EXPECT_EQ(replay.outcome(), pb::OUTCOME_COMPLETED);
  EXPECT_TRUE(MessageDifferencer::Equals(replay.record(), done.record()));
  EXPECT_EQ(metric(*s, replays), 0);
  EXPECT_EQ(metric(*s, "idem_redis_fallback_total{reason=\"unknown_key\"}"), 1);
  const std::string by_k2 =
      RawRedis(env->redis().port(), {"GET", RedisKey(key)});
  ASSERT_GT(by_k2.size(), 40u);
  EXPECT_NE(by_k2.substr(4, 4), by_k1.substr(4, 4));
  ASSERT_TRUE(begin(*s, key, &replay).ok());
  EXPECT_EQ(metric(*s, replays), 1);
  s.reset();
  std::remove(k1.c_str());
  std::remove(k2.c_str());
}

// --redis needs a key of the cache's MAC, from a file or the environment
// (not both), of at least 32 bytes; start-up fails naming the flag.
TEST(RedisMacKeyTest, StartupNeedsAGoodKeyWithRedis) {
  const std::string good = WriteKeyFile("good", std::string(32, 'g'));
  const std::string other = WriteKeyFile("other", std::string(40, 'o'));
  const std::string short_key = WriteKeyFile("short", std::string(31, 's'));
  const std::string empty = WriteKeyFile("empty", "\n");
  struct Case {
    std::vector<std::string> flags;
    std::vector<std::string> env;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{}, {}, "--redis needs --redis-mac-key-file"},
      {{"--redis-mac-key-file=" + short_key}, {}, "--redis-mac-key-file"},
      {{"--redis-mac-key-file=" + empty}, {}, "empty"},
      {{"--redis-mac-key-file=/nonexistent"}, {}, "cannot read"},
      {{}, {"IDEM_REDIS_MAC_KEY=short"}, "--redis-mac-key-file"},
      {{"--redis-mac-key-file=" + good},
       {"IDEM_REDIS_MAC_KEY=" + std::string(32, 'e')},
       "--redis-mac-key-file and IDEM_REDIS_MAC_KEY are both set"},
      {{"--redis-mac-key-file=" + good,
        "--redis-mac-previous-key-file=" + short_key},
       {},
       "--redis-mac-previous-key-file"},
      {{"--redis-mac-key-file=" + good,
        "--redis-mac-previous-key-file=" + good},
       {},
       "--redis-mac-previous-key-file"},
      {{"--redis-mac-previous-key-file=" + other}, {}, "--redis-mac-key-file"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> argv = {
        IDEM_SIDECAR_PATH, "--store=memory", "--metrics-listen=off",
        "--listen=127.0.0.1:0", "--redis=127.0.0.1:1"};
    argv.insert(argv.end(), c.flags.begin(), c.flags.end());
    RunOptions options;
    options.env = c.env;
    options.timeout = absl::Seconds(20);
    absl::StatusOr<std::string> out = RunCommand(argv, options);
    ASSERT_FALSE(out.ok()) << CommandLine(argv);
    EXPECT_TRUE(absl::StrContains(out.status().message(), c.message))
        << CommandLine(argv) << ": " << out.status();
  }
  for (const std::string& f : {good, other, short_key, empty}) {
    std::remove(f.c_str());
  }
}

TEST_F(RedisTest, EntriesLiveNoLongerThanTheirRecord) {
  const pb::Record day = Finish(0, K("day"), "day");
  const absl::Time now = absl::Now();
  int64_t pttl = 0;
  ASSERT_TRUE(absl::SimpleAtoi(Cli({"PTTL", RedisKey(K("day"))}), &pttl));
  const absl::Time expires_at =
      absl::FromUnixSeconds(day.expires_at().seconds()) +
      absl::Nanoseconds(day.expires_at().nanos());
  EXPECT_LE(pttl, absl::ToInt64Milliseconds(expires_at - now));
  EXPECT_GT(pttl,
            absl::ToInt64Milliseconds(absl::Hours(24) - absl::Minutes(1)));

  // Retention 2s: the entry is gone from Redis by expires_at.
  const pb::RecordKey brief = K("brief", "ephemeral");
  const pb::Record short_lived = Finish(1, brief, "brief");
  ASSERT_TRUE(absl::SimpleAtoi(Cli({"PTTL", RedisKey(brief)}), &pttl));
  EXPECT_GT(pttl, 0);
  EXPECT_LE(pttl, 2000);
  const absl::Time brief_expires =
      absl::FromUnixSeconds(short_lived.expires_at().seconds()) +
      absl::Nanoseconds(short_lived.expires_at().nanos());
  absl::SleepFor(brief_expires + absl::Milliseconds(1) - absl::Now());
  EXPECT_EQ(Cli({"EXISTS", RedisKey(brief)}), "0");
}

TEST_F(RedisTest, PurgedRecordsLeaveRedis) {
  const pb::RecordKey key = K("purged");
  Finish(0, key, "old");
  ASSERT_EQ(Cli({"EXISTS", RedisKey(key)}), "1");
  // The record's retention ends now, long before its cache entry's TTL
  // (as when clocks disagree): the purger must delete the entry.
  env->Sql(absl::StrCat(
      "UPDATE idempotency_record SET expires_at = now() - interval '1s', "
      "tombstone_retention = interval '0' WHERE tenant_id = '",
      tenant_, "'"));
  EXPECT_TRUE(WaitFor([&] {
    return env->Sql(absl::StrCat(
               "SELECT count(*) FROM idempotency_record WHERE tenant_id = '",
               tenant_, "'")) == "0";
  }));
  EXPECT_TRUE(WaitFor(
      [&] {
        return Cli({"EXISTS", RedisKey(key)}) == "0";
      },
      absl::Seconds(2)));
  for (int i = 0; i < env->size(); ++i) {
    pb::BeginResponse resp;
    ASSERT_TRUE(Begin(i, key, "hash-1", &resp).ok());
    EXPECT_EQ(resp.outcome(),
              i == 0 ? pb::OUTCOME_ACQUIRED : pb::OUTCOME_IN_PROGRESS);
  }
}

TEST_F(RedisTest, ResolveOfAnUnknownRecordIsVisibleThroughTheCache) {
  const pb::RecordKey key = K("lost");
  pb::BeginResponse grant;
  ASSERT_TRUE(Begin(0, key, "hash-1", &grant, absl::Seconds(1)).ok());
  ASSERT_EQ(grant.outcome(), pb::OUTCOME_ACQUIRED);
  ASSERT_TRUE(WaitFor([&] {
    pb::BeginResponse resp;
    return Begin(1, key, "hash-1", &resp).ok() &&
           resp.outcome() == pb::OUTCOME_UNKNOWN;
  }));
  EXPECT_EQ(Cli({"EXISTS", RedisKey(key)}), "0");

  pb::ResolveRequest req;
  *req.mutable_key() = key;
  req.set_to(pb::STATUS_SUCCEEDED);
  *req.mutable_result() = BinarySnapshot(200, "settled");
  req.set_reason("ledger shows the payment");
  req.set_actor("alice");
  pb::ResolveResponse resolved;
  grpc::Status s = env->admin(0).Resolve(Ctx().get(), req, &resolved);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(Cli({"EXISTS", RedisKey(key)}), "1");

  const double redis = RedisReplays(1);
  pb::BeginResponse replay;
  ASSERT_TRUE(Begin(1, key, "hash-1", &replay).ok());
  EXPECT_EQ(replay.outcome(), pb::OUTCOME_COMPLETED);
  EXPECT_TRUE(MessageDifferencer::Equals(replay.record(), resolved.record()));
  EXPECT_EQ(replay.record().resolved_by(), "alice");
  EXPECT_EQ(RedisReplays(1), redis + 1);
}

TEST_F(RedisTest, RetryableFailuresAreNotCached) {
  const pb::RecordKey key = K("flaky");
  FailIt(0, key, "try again", /*retryable=*/true);
  EXPECT_EQ(Cli({"EXISTS", RedisKey(key)}), "0");
  pb::BeginResponse again;
  ASSERT_TRUE(Begin(1, key, "hash-1", &again).ok());
  EXPECT_EQ(again.outcome(), pb::OUTCOME_ACQUIRED);
  EXPECT_EQ(again.fencing_token(), 2);
}

TEST_F(RedisTest, HealthStaysServingWhileRedisIsDown) {
  const pb::RecordKey key = K("paid");
  const pb::Record record = Finish(0, key, "paid");
  const int down_lines = LogCount(0, "redis unreachable");
  const int up_lines = LogCount(0, "redis reachable");

  ASSERT_TRUE(env->redis().Kill().ok());
  for (int i = 0; i < env->size(); ++i) {
    EXPECT_TRUE(WaitFor([&] { return Metric(i, "idem_redis_up") == 0; },
                        absl::Seconds(5)));
    EXPECT_EQ(HealthOf(env->health(i)), Serving::SERVING);
    const double open = Fallbacks(i, "breaker_open");
    pb::BeginResponse resp;
    ASSERT_TRUE(Begin(i, key, "hash-1", &resp).ok());
    EXPECT_EQ(resp.outcome(), pb::OUTCOME_COMPLETED);
    EXPECT_TRUE(MessageDifferencer::Equals(resp.record(), record));
    EXPECT_EQ(Fallbacks(i, "breaker_open"), open + 1);
    // Writes need only PostgreSQL.
    Finish(i, K(absl::StrCat("during-", i)), "during");
  }
  EXPECT_EQ(LogCount(0, "redis unreachable"), down_lines + 1);

  ASSERT_TRUE(env->redis().StartAgain().ok());
  for (int i = 0; i < env->size(); ++i) {
    EXPECT_TRUE(WaitFor([&] { return Metric(i, "idem_redis_up") == 1; },
                        absl::Seconds(5)));
    const double redis = RedisReplays(i);
    pb::BeginResponse resp;
    ASSERT_TRUE(Begin(i, key, "hash-1", &resp).ok());  // Refills.
    ASSERT_TRUE(Begin(i, key, "hash-1", &resp).ok());
    EXPECT_TRUE(MessageDifferencer::Equals(resp.record(), record));
    EXPECT_EQ(RedisReplays(i), redis + (i == 0 ? 1 : 2));
  }
  EXPECT_EQ(LogCount(0, "redis reachable"), up_lines + 1);
  EXPECT_EQ(LogCount(0, "redis unreachable"), down_lines + 1);
}

TEST_F(RedisTest, ReplaysFromRedisAreFasterThanFromPostgres) {
  constexpr int kRecords = 50;
  constexpr int kReplays = 1000;
  std::vector<pb::Record> expected;
  expected.reserve(kRecords);
  for (int k = 0; k < kRecords; ++k) {
    expected.push_back(Finish(0, K(absl::StrCat("r", k)), "x"));
  }
  // Redis GETs past the 5 ms default timeout, which a sanitized build under
  // load sometimes takes, fall through to PostgreSQL by design (and the
  // breaker then skips Redis until a probe answers).
  auto fell_through = [] {
    return Fallbacks(0, "timeout") + Fallbacks(0, "breaker_open");
  };
  // Sequential replays on sidecar 0; returns their p50 and p99.
  auto measure = [&](const char* source) {
    const std::string series =
        absl::StrCat("idem_replay_total{source=\"", source, "\"}");
    const double before = Metric(0, series);
    const double fell_through_before = fell_through();
    std::vector<absl::Duration> took;
    for (int n = 0; n < kReplays; ++n) {
      const int k = n % kRecords;
      pb::BeginResponse resp;
      const absl::Time start = absl::Now();
      grpc::Status s = Begin(0, K(absl::StrCat("r", k)), "hash-1", &resp);
      took.push_back(absl::Now() - start);
      EXPECT_TRUE(s.ok()) << s.error_message();
      EXPECT_TRUE(MessageDifferencer::Equals(resp.record(), expected[k]));
    }
    // Every replay from `source`; from Redis, but for the fall-throughs
    // above (at most a tenth).
    const double served = Metric(0, series) - before;
    if (std::string(source) == "redis") {
      EXPECT_EQ(served + fell_through() - fell_through_before, kReplays);
      EXPECT_GE(served, kReplays * 9 / 10);
    } else {
      EXPECT_EQ(served, kReplays) << source;
    }
    std::sort(took.begin(), took.end());
    return std::pair{took[kReplays / 2], took[kReplays * 99 / 100]};
  };
  const auto [redis_p50, redis_p99] = measure("redis");
  ASSERT_TRUE(env->redis().Kill().ok());
  ASSERT_TRUE(WaitFor([] { return Metric(0, "idem_redis_up") == 0; }));
  const auto [pg_p50, pg_p99] = measure("postgres");
  std::cout << "sequential replays: redis p50 " << redis_p50 << " p99 "
            << redis_p99 << "; postgres p50 " << pg_p50 << " p99 " << pg_p99
            << "; server-side means: redis get " << StoreMean(0, "redis", "get")
            << ", postgres read " << StoreMean(0, "postgres", "read")
            << ", postgres insert " << StoreMean(0, "postgres", "insert")
            << std::endl;
  EXPECT_LT(redis_p50, pg_p50);
}

TEST_F(RedisTest, ConnectionsClosedWhileIdleAreNotAnOutage) {
  const pb::RecordKey key = K("k");
  const pb::Record record = Finish(0, key, "k");
  // Concurrent replays, so that each sidecar pools several connections.
  auto burst = [&] {
    std::vector<std::thread> threads;
    threads.reserve(8);
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&, t] {
        for (int n = 0; n < 20; ++n) {
          pb::BeginResponse resp;
          EXPECT_TRUE(Begin(t % 2, key, "hash-1", &resp).ok());
          EXPECT_TRUE(MessageDifferencer::Equals(resp.record(), record));
        }
      });
    }
    for (std::thread& t : threads) t.join();
  };
  burst();
  // What a stale connection that was not retried would show: a lookup that
  // failed with an error (not a timeout: under a loaded machine a lookup may
  // miss --redis-timeout, which falls through as documented) and Redis
  // reported unreachable for it.
  auto stale_failures = [](int i) {
    return Fallbacks(i, "error") +
           LogCount(i, "redis unreachable", "did not answer in time");
  };
  auto accounted = [] {
    double n = 0;
    for (int i = 0; i < 2; ++i) {
      n += RedisReplays(i) + Fallbacks(i, "timeout") +
           Fallbacks(i, "breaker_open");
    }
    return n;
  };
  const std::array<double, 2> failures = {stale_failures(0), stale_failures(1)};
  const double before = accounted();
  // Redis closes connections idle for more than a second.
  ASSERT_EQ(Cli({"CONFIG", "SET", "timeout", "1"}), "OK");
  absl::SleepFor(absl::Milliseconds(2500));
  burst();
  ASSERT_EQ(Cli({"CONFIG", "SET", "timeout", "0"}), "OK");
  EXPECT_EQ(stale_failures(0), failures[0]);
  EXPECT_EQ(stale_failures(1), failures[1]);
  EXPECT_EQ(accounted(), before + 8 * 20);
}

// Latencies of replays, by when they finished.
class Latencies {
 public:
  void Add(absl::Time at, absl::Duration d) {
    absl::MutexLock lock(&mu_);
    samples_.emplace_back(at, d);
  }
  // The `q` quantile of the samples that finished in [from, to); zero when
  // there are none.
  absl::Duration Quantile(double q, absl::Time from, absl::Time to) {
    std::vector<absl::Duration> in;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [at, d] : samples_) {
        if (at >= from && at < to) in.push_back(d);
      }
    }
    if (in.empty()) return absl::ZeroDuration();
    std::sort(in.begin(), in.end());
    const auto at = static_cast<size_t>(q * static_cast<double>(in.size()));
    return in[std::min(in.size() - 1, at)];
  }
  size_t Count(absl::Time from, absl::Time to) {
    absl::MutexLock lock(&mu_);
    return std::count_if(samples_.begin(), samples_.end(), [&](const auto& s) {
      return s.first >= from && s.first < to;
    });
  }

 private:
  absl::Mutex mu_;
  std::vector<std::pair<absl::Time, absl::Duration>> samples_
      ABSL_GUARDED_BY(mu_);
};

TEST_F(RedisTest, KillPauseAndFlushUnderLoadChangeNoAnswer) {
  constexpr int kRecords = 200;
  constexpr int kThreads = 20;
  std::vector<pb::Record> expected(kRecords);
  for (int k = 0; k < kRecords; ++k) {
    const pb::RecordKey key = K(absl::StrCat("r", k));
    expected[k] = k % 5 == 0 ? FailIt(k % 2, key, absl::StrCat("f", k))
                             : Finish(k % 2, key, absl::StrCat("s", k));
  }

  std::atomic<bool> stop{false};
  std::atomic<int64_t> replays{0}, wrong{0}, errors{0}, extra_grants{0},
      fresh{0};
  Latencies latencies;
  std::vector<std::string> failures;
  absl::Mutex failures_mu;
  auto fail = [&](const std::string& what) {
    absl::MutexLock lock(&failures_mu);
    if (failures.size() < 20) failures.push_back(what);
  };
  auto worker = [&](int t) {
    std::mt19937 rng(t);
    int n = 0;
    while (!stop) {
      const int i = static_cast<int>(rng() % 2);
      const int dice = static_cast<int>(rng() % 20);
      if (dice == 0) {
        // A new key: exactly one grant, then a replay of its result.
        const pb::RecordKey key = K(absl::StrCat("new-", t, "-", n++));
        pb::BeginResponse first, second;
        grpc::Status s = Begin(i, key, "hash-1", &first);
        if (!s.ok() || first.outcome() != pb::OUTCOME_ACQUIRED) {
          ++errors;
          fail(absl::StrCat("new key: ", s.error_message(), " ",
                            first.outcome()));
          continue;
        }
        s = Begin(1 - i, key, "hash-1", &second);
        if (s.ok() && second.outcome() == pb::OUTCOME_ACQUIRED) ++extra_grants;
        pb::CompleteRequest req;
        *req.mutable_key() = key;
        req.set_fencing_token(first.fencing_token());
        *req.mutable_result() = BinarySnapshot(200, key.key());
        pb::CompleteResponse done;
        if (!env->client(i).Complete(Ctx().get(), req, &done).ok()) ++errors;
        ++fresh;
        continue;
      }
      const int k = static_cast<int>(rng() % kRecords);
      const pb::RecordKey key = K(absl::StrCat("r", k));
      const bool mismatch = dice == 1;
      pb::BeginResponse resp;
      const absl::Time start = absl::Now();
      grpc::Status s = Begin(i, key, mismatch ? "hash-2" : "hash-1", &resp);
      const absl::Time end = absl::Now();
      if (!s.ok()) {
        ++errors;
        fail(absl::StrCat("replay error: ", s.error_message()));
        continue;
      }
      if (mismatch) {
        if (resp.outcome() != pb::OUTCOME_MISMATCH ||
            resp.record().has_result()) {
          ++wrong;
          fail(absl::StrCat("mismatch answered ", resp.outcome()));
        }
        continue;
      }
      ++replays;
      latencies.Add(end, end - start);
      const pb::Outcome want =
          k % 5 == 0 ? pb::OUTCOME_FAILED : pb::OUTCOME_COMPLETED;
      if (resp.outcome() != want ||
          !MessageDifferencer::Equals(resp.record(), expected[k]) ||
          resp.record().result().body() != expected[k].result().body()) {
        ++wrong;
        fail(absl::StrCat("replay of r", k, " answered ", resp.outcome()));
      }
    }
  };
  auto timeouts = [] {
    return Fallbacks(0, "timeout") + Fallbacks(1, "timeout");
  };
  auto redis_replays = [] { return RedisReplays(0) + RedisReplays(1); };

  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  constexpr absl::Duration kPhase = absl::Milliseconds(1500);

  absl::SleepFor(kPhase);
  const absl::Time baseline_end = absl::Now();
  ASSERT_TRUE(env->redis().Kill().ok());
  absl::SleepFor(kPhase);
  ASSERT_TRUE(env->redis().StartAgain().ok());
  absl::SleepFor(kPhase);

  const double timeouts_before_pause = timeouts();
  const absl::Time pause_start = absl::Now();
  ASSERT_TRUE(env->redis().Pause().ok());
  absl::SleepFor(kPhase);
  const absl::Time pause_end = absl::Now();
  const double pause_timeouts = timeouts() - timeouts_before_pause;
  ASSERT_TRUE(env->redis().Resume().ok());
  absl::SleepFor(kPhase);

  ASSERT_EQ(Cli({"FLUSHALL"}), "OK");
  absl::SleepFor(kPhase);
  const double redis_before_last = redis_replays();
  const int64_t replays_before_last = replays;
  const absl::Time last_start = absl::Now();
  absl::SleepFor(absl::Seconds(1));
  const absl::Time last_end = absl::Now();
  const double redis_last = redis_replays() - redis_before_last;
  const int64_t replays_last = replays - replays_before_last;
  stop = true;
  for (std::thread& t : threads) t.join();

  for (const std::string& f : failures) ADD_FAILURE() << f;
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(extra_grants, 0);
  EXPECT_EQ(errors, 0);

  const absl::Duration base_p50 =
      latencies.Quantile(0.5, baseline_end - absl::Seconds(1), baseline_end);
  const absl::Duration last_p50 = latencies.Quantile(0.5, last_start, last_end);
  const absl::Duration pause_p99 =
      latencies.Quantile(0.99, pause_start, pause_end);
  std::cout << "replays " << replays << " (" << fresh << " new keys); "
            << "baseline p50 " << base_p50 << " over "
            << latencies.Count(baseline_end - absl::Seconds(1), baseline_end)
            << "; paused p50 "
            << latencies.Quantile(0.5, pause_start, pause_end) << " p99 "
            << pause_p99 << " with " << pause_timeouts
            << " redis timeouts over "
            << latencies.Count(pause_start, pause_end) << "; last second p50 "
            << last_p50 << ", " << redis_last << " of " << replays_last
            << " replays from redis" << std::endl;
  EXPECT_GT(latencies.Count(baseline_end - absl::Seconds(1), baseline_end),
            100u);
  EXPECT_LE(last_p50, std::max(4 * base_p50, base_p50 + absl::Milliseconds(5)));
  // A stopped Redis costs one timeout per in-flight call, then none until a
  // probe answers: far fewer timeouts than calls.
  EXPECT_LE(pause_timeouts, 2 * kThreads);
  EXPECT_LT(pause_p99, absl::Milliseconds(250));
  // Back to the cache after the flush.
  EXPECT_GT(redis_last, 0.5 * static_cast<double>(replays_last));
}

TEST(RedisAuthTest, AuthenticatesWithAPasswordFromAFileOrTheEnvironment) {
  ASSERT_NE(env, nullptr) << "environment did not start";
  absl::StatusOr<std::unique_ptr<RedisServer>> redis = RedisServer::Start();
  ASSERT_TRUE(redis.ok()) << redis.status();
  const std::string secret = "s3cret-Pa55";
  ASSERT_EQ(*(*redis)->Cli({"ACL", "SETUSER", "sidecar", "on", ">" + secret,
                            "~idem:*", "+@all"}),
            "OK");
  const std::string file = ::testing::TempDir() + "/idem-redis-password";
  std::ofstream(file) << secret << "\n";
  const std::vector<std::string> common = {
      "--postgres=" + env->pg().ConnInfo(), "--redis=" + (*redis)->Address(),
      env->RedisMacKeyFlag(), "--redis-user=sidecar"};

  std::vector<std::string> from_file = common;
  from_file.push_back("--redis-password-file=" + file);
  absl::StatusOr<std::unique_ptr<SidecarProcess>> a =
      SidecarProcess::Start(IDEM_SIDECAR_PATH, from_file);
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<std::unique_ptr<SidecarProcess>> b = SidecarProcess::Start(
      IDEM_SIDECAR_PATH, common, 0, {"IDEM_REDIS_PASSWORD=" + secret});
  ASSERT_TRUE(b.ok()) << b.status();

  for (SidecarProcess* s : {a->get(), b->get()}) {
    EXPECT_TRUE(WaitFor([&] {
      absl::StatusOr<std::string> m = HttpGet(s->metrics_port(), "/metrics");
      return m.ok() && MetricValue(*m, "idem_redis_up") == 1;
    })) << s->Log();
  }
  absl::StatusOr<std::string> clients = (*redis)->Cli({"CLIENT", "LIST"});
  ASSERT_TRUE(clients.ok());
  EXPECT_GE(std::count(clients->begin(), clients->end(), '\n') + 1, 3);
  for (absl::string_view line : absl::StrSplit(*clients, '\n')) {
    if (absl::StrContains(line, "cmd=client")) continue;  // redis-cli itself
    EXPECT_TRUE(absl::StrContains(line, "user=sidecar")) << line;
  }

  // A wrong password leaves the cache off and the sidecar serving.
  absl::StatusOr<std::unique_ptr<SidecarProcess>> wrong = SidecarProcess::Start(
      IDEM_SIDECAR_PATH, common, 0, {"IDEM_REDIS_PASSWORD=not-it"});
  ASSERT_TRUE(wrong.ok()) << wrong.status();
  absl::SleepFor(absl::Milliseconds(500));
  absl::StatusOr<std::string> m = HttpGet((*wrong)->metrics_port(), "/metrics");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(MetricValue(*m, "idem_redis_up"), 0);
  auto channel = grpc::CreateChannel((*wrong)->Address(),
                                     grpc::InsecureChannelCredentials());
  pb::BeginRequest req;
  *req.mutable_key() = Key("RedisAuthTest", "create-payment", "k");
  req.set_request_hash("hash-1");
  pb::BeginResponse resp;
  grpc::Status s =
      pb::Idempotency::NewStub(channel)->Begin(Ctx().get(), req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.outcome(), pb::OUTCOME_ACQUIRED);
  EXPECT_TRUE(absl::StrContains((*wrong)->Log(), "WRONGPASS"))
      << (*wrong)->Log();

  // The password shows neither in a log nor on a command line.
  for (SidecarProcess* s : {a->get(), b->get(), wrong->get()}) {
    EXPECT_FALSE(absl::StrContains(s->Log(), secret));
    const std::string cmdline =
        ReadFile(absl::StrCat("/proc/", s->pid(), "/cmdline"));
    EXPECT_FALSE(cmdline.empty());
    EXPECT_FALSE(absl::StrContains(cmdline, secret));
  }
}

// The in-process cache (default on) in front of Redis: a replay this
// instance saw is answered from memory, byte for byte, with Redis and
// PostgreSQL both gone; and never after the record's expires_at, when only
// the store may answer (EXPIRED, or a new owner).
TEST_F(RedisTest, InProcessCacheAnswersReplaysButNeverPastExpiry) {
  absl::StatusOr<std::string> dir = MakeTempDir("idem-local-cache-");
  ASSERT_TRUE(dir.ok()) << dir.status();
  const std::string config = *dir + "/config.yaml";
  std::ofstream(config) << kConfig;
  absl::StatusOr<std::unique_ptr<SidecarProcess>> s = SidecarProcess::Start(
      IDEM_SIDECAR_PATH, {"--postgres=" + env->pg().ConnInfo(),
                          "--redis=" + env->redis().Address(),
                          env->RedisMacKeyFlag(), "--config=" + config});
  ASSERT_TRUE(s.ok()) << s.status();
  auto stub = pb::Idempotency::NewStub(
      grpc::CreateChannel((*s)->Address(), grpc::InsecureChannelCredentials()));
  auto begin = [&](const pb::RecordKey& key, pb::BeginResponse* resp) {
    pb::BeginRequest req;
    *req.mutable_key() = key;
    req.set_request_hash("hash-1");
    return stub->Begin(Ctx(absl::Seconds(5)).get(), req, resp);
  };
  auto finish = [&](const pb::RecordKey& key) {
    pb::BeginResponse grant;
    EXPECT_TRUE(begin(key, &grant).ok());
    EXPECT_EQ(grant.outcome(), pb::OUTCOME_ACQUIRED);
    pb::CompleteRequest req;
    *req.mutable_key() = key;
    req.set_fencing_token(grant.fencing_token());
    *req.mutable_result() = BinarySnapshot(201, key.key());
    pb::CompleteResponse resp;
    EXPECT_TRUE(stub->Complete(Ctx().get(), req, &resp).ok());
    return resp.record();
  };
  auto memory_replays = [&] {
    absl::StatusOr<std::string> m = HttpGet((*s)->metrics_port(), "/metrics");
    return m.ok() ? MetricValue(*m, "idem_replay_total{source=\"memory\"}")
                  : -1;
  };
  const pb::RecordKey paid = K("paid");
  const pb::RecordKey brief = K("brief", "ephemeral");  // retention 2s
  const pb::Record paid_record = finish(paid);
  const absl::Time brief_done = absl::Now();
  finish(brief);

  ASSERT_TRUE(env->redis().Kill().ok());
  ASSERT_TRUE(env->pg().Stop().ok());
  pb::BeginResponse replay;
  grpc::Status st = begin(paid, &replay);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(replay.outcome(), pb::OUTCOME_COMPLETED);
  EXPECT_TRUE(MessageDifferencer::Equals(replay.record(), paid_record));
  EXPECT_EQ(memory_replays(), 1);

  absl::SleepFor(brief_done + absl::Milliseconds(2500) - absl::Now());
  pb::BeginResponse late;
  st = begin(brief, &late);
  EXPECT_FALSE(st.ok() && late.outcome() == pb::OUTCOME_COMPLETED)
      << "replayed from memory after its expires_at";
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE)
      << st.error_message();
  EXPECT_EQ(memory_replays(), 1);
  s->reset();
  RemoveTempDir(*dir);
}

TEST(RedisUnixSocketTest, CachesOverAUnixSocket) {
  ASSERT_NE(env, nullptr) << "environment did not start";
  absl::StatusOr<std::string> dir = MakeTempDir("idem-redis-unix-");
  ASSERT_TRUE(dir.ok()) << dir.status();
  const std::string sock = *dir + "/redis.sock";
  absl::StatusOr<std::unique_ptr<Process>> redis =
      Process::Spawn({"redis-server", "--port", "0", "--unixsocket", sock,
                      "--save", "", "--appendonly", "no", "--dir", *dir},
                     {}, *dir + "/log", *dir);
  ASSERT_TRUE(redis.ok()) << redis.status();
  auto cli = [&](const std::vector<std::string>& args) {
    std::vector<std::string> argv = {"redis-cli", "-s", sock};
    argv.insert(argv.end(), args.begin(), args.end());
    RunOptions options;
    options.timeout = absl::Seconds(5);
    absl::StatusOr<std::string> out = RunCommand(argv, options);
    return out.ok() ? std::string(absl::StripTrailingAsciiWhitespace(*out))
                    : out.status().ToString();
  };
  ASSERT_TRUE(WaitFor([&] { return cli({"PING"}) == "PONG"; }))
      << ReadFile(*dir + "/log");

  absl::StatusOr<std::unique_ptr<SidecarProcess>> s = SidecarProcess::Start(
      IDEM_SIDECAR_PATH,
      {"--postgres=" + env->pg().ConnInfo(), "--redis=unix:" + sock,
       env->RedisMacKeyFlag(), "--local-cache-mib=0"});
  ASSERT_TRUE(s.ok()) << s.status();
  auto stub = pb::Idempotency::NewStub(
      grpc::CreateChannel((*s)->Address(), grpc::InsecureChannelCredentials()));
  const pb::RecordKey key = Key("RedisUnixSocketTest", "create-payment", "k");
  pb::BeginRequest begin;
  *begin.mutable_key() = key;
  begin.set_request_hash("hash-1");
  pb::BeginResponse grant;
  ASSERT_TRUE(stub->Begin(Ctx().get(), begin, &grant).ok());
  ASSERT_EQ(grant.outcome(), pb::OUTCOME_ACQUIRED);
  pb::CompleteRequest complete;
  *complete.mutable_key() = key;
  complete.set_fencing_token(grant.fencing_token());
  *complete.mutable_result() = BinarySnapshot(200, "unix");
  pb::CompleteResponse done;
  ASSERT_TRUE(stub->Complete(Ctx().get(), complete, &done).ok());
  EXPECT_EQ(cli({"EXISTS", RedisKey(key)}), "1");
  pb::BeginResponse replay;
  ASSERT_TRUE(stub->Begin(Ctx().get(), begin, &replay).ok());
  EXPECT_TRUE(MessageDifferencer::Equals(replay.record(), done.record()));
  absl::StatusOr<std::string> m = HttpGet((*s)->metrics_port(), "/metrics");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(MetricValue(*m, "idem_replay_total{source=\"redis\"}"), 1);
  s->reset();
  redis->reset();
  RemoveTempDir(*dir);
}

}  // namespace
}  // namespace idem::testing
