// The one entry point of a call, over the memory store, as the gRPC service
// and the HTTP gateway use it: a Begin without a wait is answered at once,
// one with a wait parks until the record settles, its wait runs out, its
// caller cancels or the instance shuts down; each is answered exactly once.
#include "server/core/calls.h"

#include <memory>
#include <vector>

#include "common/await.h"
#include "gtest/gtest.h"
#include "server/core/answer_test_util.h"
#include "server/metrics/metrics.h"
#include "server/store/memory_store.h"

namespace idem {
namespace {

BeginCommand Cmd(const std::string& hash) {
  BeginCommand cmd;
  cmd.request_hash = hash;
  cmd.lease = absl::Seconds(30);
  return cmd;
}

class CallsTest : public ::testing::Test {
 protected:
  explicit CallsTest(CallsOptions options = {})
      : calls_(store_.get(), store_->Changes(), &policies_, &metrics_,
               options) {}

  // Takes `key` for ten minutes; returns the fencing token.
  int64_t Hold(const RecordKey& key) {
    BeginCommand cmd = Cmd("h");
    cmd.lease = absl::Minutes(10);
    BeginAnswer a;
    calls_.Begin(key, cmd, nullptr, a.Fn());
    absl::StatusOr<BeginResult> r = a.Await();
    EXPECT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->outcome, Outcome::kAcquired);
    return r->record->fencing_token;
  }

  // Begin `key` with a wait of `wait` (none when zero).
  std::shared_ptr<Calls::Wait> Begin(const RecordKey& key, absl::Duration wait,
                                     BeginAnswer* answer) {
    std::shared_ptr<Calls::Wait> w;
    if (wait > absl::ZeroDuration()) w = calls_.NewWait(SteadyDeadline(wait));
    calls_.Begin(key, Cmd("h"), w, answer->Fn());
    return w;
  }

  absl::StatusOr<Record> Complete(const RecordKey& key, int64_t token) {
    CompleteCommand done;
    done.fencing_token = token;
    done.result.code = 201;
    done.result.body = "paid";
    return Await<absl::StatusOr<Record>>(
        [&](Calls::RecordFn fn) { calls_.Complete(key, done, std::move(fn)); });
  }

  std::unique_ptr<Store> store_ = NewMemoryStore();
  PolicySet policies_;
  Metrics metrics_;
  Calls calls_;
};

TEST_F(CallsTest, ABeginWithoutAWaitIsAnsweredInProgressAtOnce) {
  const RecordKey key{"t", "pay", "no-wait"};
  Hold(key);
  BeginAnswer a;
  Begin(key, absl::ZeroDuration(), &a);
  // The memory store answers on the caller's thread: already answered.
  ASSERT_TRUE(a.answered());
  absl::StatusOr<BeginResult> r = a.Await();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->outcome, Outcome::kInProgress);
  EXPECT_GT(r->retry_after, absl::ZeroDuration());
  EXPECT_EQ(calls_.parked(), 0);
}

TEST_F(CallsTest, ABeginThatNeedsNoWaitIsAnsweredAtOnceWithAWait) {
  const RecordKey key{"t", "pay", "free"};
  BeginAnswer a;
  Begin(key, absl::Hours(1), &a);
  ASSERT_TRUE(a.answered());
  absl::StatusOr<BeginResult> r = a.Await();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->outcome, Outcome::kAcquired);
  EXPECT_EQ(calls_.parked(), 0);
}

TEST_F(CallsTest, AWaitingBeginParksUntilTheHolderCompletes) {
  const RecordKey key{"t", "pay", "wait"};
  const int64_t token = Hold(key);
  BeginAnswer a;
  Begin(key, absl::Hours(1), &a);
  EXPECT_FALSE(a.answered());
  EXPECT_EQ(calls_.parked(), 1);

  ASSERT_TRUE(Complete(key, token).ok());
  ExpectCompletedOnce(a, "paid");
  EXPECT_EQ(calls_.parked(), 0);
}

TEST_F(CallsTest, AWaitingBeginTakesOverARetryableFailure) {
  const RecordKey key{"t", "pay", "retry"};
  const int64_t token = Hold(key);
  BeginAnswer a;
  Begin(key, absl::Hours(1), &a);
  ASSERT_EQ(calls_.parked(), 1);

  FailCommand fail;
  fail.fencing_token = token;
  fail.retryable = true;
  fail.error.code = 503;
  absl::StatusOr<Record> failed = Await<absl::StatusOr<Record>>(
      [&](Calls::RecordFn fn) { calls_.Fail(key, fail, std::move(fn)); });
  ASSERT_TRUE(failed.ok()) << failed.status();
  absl::StatusOr<BeginResult> r = a.Await();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->outcome, Outcome::kAcquired);
  EXPECT_EQ(r->record->fencing_token, token + 1);
  EXPECT_EQ(calls_.parked(), 0);
}

TEST_F(CallsTest, AWaitEndsInProgressWhenItRunsOut) {
  const RecordKey key{"t", "pay", "runs-out"};
  Hold(key);
  BeginAnswer a;
  const SteadyTime start = SteadyClock::now();
  Begin(key, absl::Milliseconds(200), &a);
  absl::StatusOr<BeginResult> r = a.Await();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->outcome, Outcome::kInProgress);
  EXPECT_GE(SteadySince(start), absl::Milliseconds(200));
  EXPECT_EQ(calls_.parked(), 0);
}

TEST_F(CallsTest, CancelAnswersAParkedBeginCancelledOnce) {
  const RecordKey key{"t", "pay", "hang-up"};
  Hold(key);
  BeginAnswer a;
  std::shared_ptr<Calls::Wait> wait = Begin(key, absl::Hours(1), &a);
  ASSERT_EQ(calls_.parked(), 1);
  calls_.Cancel(wait);
  ASSERT_TRUE(a.answered());
  absl::StatusOr<BeginResult> r = a.Await();
  EXPECT_TRUE(absl::IsCancelled(r.status())) << r.status();
  EXPECT_EQ(calls_.parked(), 0);
  // A second hang-up, and one without a wait, answer nothing.
  calls_.Cancel(wait);
  calls_.Cancel(nullptr);
  EXPECT_EQ(a.answers(), 1);
}

TEST_F(CallsTest, ABeginCancelledBeforeItStartsNeverParks) {
  const RecordKey key{"t", "pay", "gone"};
  Hold(key);
  std::shared_ptr<Calls::Wait> wait =
      calls_.NewWait(SteadyDeadline(absl::Hours(1)));
  calls_.Cancel(wait);
  BeginAnswer a;
  calls_.Begin(key, Cmd("h"), wait, a.Fn());
  ASSERT_TRUE(a.answered());
  absl::StatusOr<BeginResult> r = a.Await();
  EXPECT_TRUE(absl::IsCancelled(r.status())) << r.status();
  EXPECT_EQ(calls_.parked(), 0);
}

TEST_F(CallsTest, ShutdownAnswersParkedBeginsAndParksNoMore) {
  const RecordKey key{"t", "pay", "shutdown"};
  Hold(key);
  std::vector<BeginAnswer> answers(3);
  for (BeginAnswer& a : answers) Begin(key, absl::Hours(1), &a);
  ASSERT_EQ(calls_.parked(), 3);
  calls_.Shutdown();
  for (BeginAnswer& a : answers) {
    ASSERT_TRUE(a.answered());
    absl::StatusOr<BeginResult> r = a.Await();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->outcome, Outcome::kInProgress);
  }
  BeginAnswer late;
  Begin(key, absl::Hours(1), &late);
  ASSERT_TRUE(late.answered());
  absl::StatusOr<BeginResult> r = late.Await();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->outcome, Outcome::kInProgress);
  EXPECT_EQ(calls_.parked(), 0);
}

class CallsBoundTest : public CallsTest {
 protected:
  CallsBoundTest() : CallsTest(Options()) {}
  static CallsOptions Options() {
    CallsOptions options;
    options.waiters.per_key = 1;
    return options;
  }
};

TEST_F(CallsBoundTest, TheWaiterLimitsAreThoseGiven) {
  const RecordKey key{"t", "pay", "bound"};
  Hold(key);
  BeginAnswer first, second;
  Begin(key, absl::Hours(1), &first);
  Begin(key, absl::Hours(1), &second);
  EXPECT_FALSE(first.answered());
  ASSERT_TRUE(second.answered());
  absl::Status refused = second.Await().status();
  EXPECT_TRUE(absl::IsResourceExhausted(refused)) << refused;
  EXPECT_NE(refused.message().find("--max-waiters-per-key=1"),
            std::string::npos)
      << refused;
  EXPECT_EQ(calls_.parked(), 1);
  // Answered before it goes.
  calls_.Shutdown();
  EXPECT_EQ(first.answers(), 1);
}

}  // namespace
}  // namespace idem
