// Parked Begins over the memory store: answered when their record settles,
// when their wait or the holder's lease runs out, when their caller hangs
// up, at shutdown, or refused at a bound; none holds a thread while parked.
#include "server/core/begin_waiters.h"

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/core/answer_test_util.h"
#include "server/core/sync_calls.h"
#include "server/metrics/metrics.h"
#include "server/store/memory_store.h"

namespace idem {
namespace {

class BeginWaitersTest : public ::testing::Test {
 protected:
  explicit BeginWaitersTest(WaiterLimits limits = {}) : limits_(limits) {}

  void SetUp() override {
    waiters_ = std::make_unique<BeginWaiters>(
        &coordinator_, store_.get(), store_->Changes(), limits_, &metrics_);
  }
  void TearDown() override { waiters_.reset(); }

  static BeginCommand Cmd(const std::string& hash, absl::Duration lease) {
    BeginCommand cmd;
    cmd.request_hash = hash;
    cmd.lease = lease;
    return cmd;
  }

  // Begin, then parked until `wait` runs out, as the service runs it.
  void Park(const std::shared_ptr<BeginWaiters::Ticket>& ticket,
            const RecordKey& key, const BeginCommand& cmd, absl::Duration wait,
            BeginAnswer* answer) {
    waiters_->Settle(ticket, key, cmd, coordinator_.Begin(key, cmd),
                     SteadyDeadline(wait), answer->Fn());
  }

  // Takes `key` with a lease of `lease`; returns the fencing token.
  int64_t Hold(const RecordKey& key, absl::Duration lease) {
    absl::StatusOr<BeginResult> r = coordinator_.Begin(key, Cmd("h", lease));
    EXPECT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->outcome, Outcome::kAcquired);
    return r->record->fencing_token;
  }

  void Complete(const RecordKey& key, int64_t token) {
    CompleteCommand done;
    done.fencing_token = token;
    done.result.code = 201;
    done.result.body = "paid";
    ASSERT_TRUE(coordinator_.Complete(key, done).ok());
  }

  const WaiterLimits limits_;
  std::unique_ptr<Store> store_ = NewMemoryStore();
  PolicySet policies_;
  Metrics metrics_;
  SyncCoordinator coordinator_{store_.get(), &policies_};
  std::unique_ptr<BeginWaiters> waiters_;
};

TEST_F(BeginWaitersTest, ParkedBeginsGetTheReplayWhenTheRecordCompletes) {
  const RecordKey key{"t", "pay", "k1"};
  const int64_t token = Hold(key, absl::Minutes(10));
  constexpr int kWaiters = 200;
  std::vector<BeginAnswer> answers(kWaiters);
  for (BeginAnswer& a : answers) {
    Park(BeginWaiters::NewTicket(), key, Cmd("h", absl::Seconds(30)),
         absl::Hours(1), &a);
  }
  EXPECT_EQ(waiters_->parked(), kWaiters);
  for (BeginAnswer& a : answers) EXPECT_FALSE(a.answered());

  Complete(key, token);
  for (BeginAnswer& a : answers) ExpectCompletedOnce(a, "paid");
  EXPECT_EQ(waiters_->parked(), 0);
}

TEST_F(BeginWaitersTest, AChangeBeforeParkingIsNotMissed) {
  const RecordKey key{"t", "pay", "k2"};
  const int64_t token = Hold(key, absl::Minutes(10));
  const BeginCommand cmd = Cmd("h", absl::Seconds(30));
  // Found IN_PROGRESS, then the record completes before the Begin parks:
  // no change event will come for it any more.
  absl::StatusOr<BeginResult> busy = coordinator_.Begin(key, cmd);
  ASSERT_TRUE(busy.ok());
  ASSERT_EQ(busy->outcome, Outcome::kInProgress);
  Complete(key, token);
  BeginAnswer a;
  waiters_->Settle(BeginWaiters::NewTicket(), key, cmd, *busy,
                   SteadyDeadline(absl::Hours(1)), a.Fn());
  absl::StatusOr<BeginResult> r = a.Await(absl::Seconds(5));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->outcome, Outcome::kCompleted);
}

TEST_F(BeginWaitersTest, ASettlePublishedWithItsRecordIsDecidedWithoutARead) {
  const RecordKey key{"t", "pay", "k-settled"};
  Hold(key, absl::Minutes(10));
  constexpr int kWaiters = 50;
  std::vector<BeginAnswer> answers(kWaiters);
  for (BeginAnswer& a : answers) {
    Park(BeginWaiters::NewTicket(), key, Cmd("h", absl::Seconds(30)),
         absl::Hours(1), &a);
  }
  ASSERT_EQ(waiters_->parked(), kWaiters);
  // The store still holds the record PROCESSING: a Begin that read it would
  // park again. Only the published record can answer them.
  absl::StatusOr<StoreRead> held = ReadNow(*store_, key);
  ASSERT_TRUE(held.ok() && held->record.has_value());
  Record settled = *held->record;
  settled.status = Status::kSucceeded;
  settled.result = Snapshot{201, "paid here", "text/plain", {}};
  settled.updated_at = held->now;
  settled.expires_at = held->now + absl::Hours(24);
  store_->Changes()->PublishSettled(settled);
  for (BeginAnswer& a : answers) ExpectCompletedOnce(a, "paid here");
  EXPECT_EQ(waiters_->parked(), 0);
  // A settle of a key nobody waits on is ignored.
  settled.key.key = "k-nobody";
  store_->Changes()->PublishSettled(settled);
  EXPECT_EQ(waiters_->parked(), 0);
}

TEST_F(BeginWaitersTest, TheWaitEndsInProgressAtItsDeadline) {
  const RecordKey key{"t", "pay", "k3"};
  Hold(key, absl::Minutes(10));
  BeginAnswer a;
  const SteadyTime start = SteadyClock::now();
  Park(BeginWaiters::NewTicket(), key, Cmd("h", absl::Seconds(30)),
       absl::Milliseconds(200), &a);
  absl::StatusOr<BeginResult> r = a.Await();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->outcome, Outcome::kInProgress);
  EXPECT_GE(SteadySince(start), absl::Milliseconds(200));
  EXPECT_EQ(waiters_->parked(), 0);
}

TEST_F(BeginWaitersTest, TheHoldersLeaseRunningOutWakesTheWaiters) {
  const RecordKey key{"t", "pay", "k4"};
  Hold(key, absl::Milliseconds(300));
  BeginAnswer a;
  const SteadyTime start = SteadyClock::now();
  Park(BeginWaiters::NewTicket(), key, Cmd("h", absl::Seconds(30)),
       absl::Hours(1), &a);
  // No change event comes: the waiter reads again once the lease is out,
  // and the default policy makes the record UNKNOWN.
  absl::StatusOr<BeginResult> r = a.Await();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->outcome, Outcome::kUnknown);
  EXPECT_LT(SteadySince(start), absl::Seconds(5));
}

TEST_F(BeginWaitersTest, ACallerThatHangsUpIsDroppedAtOnce) {
  const RecordKey key{"t", "pay", "k5"};
  Hold(key, absl::Minutes(10));
  auto ticket = BeginWaiters::NewTicket();
  BeginAnswer a;
  Park(ticket, key, Cmd("h", absl::Seconds(30)), absl::Hours(1), &a);
  ASSERT_EQ(waiters_->parked(), 1);
  waiters_->Cancel(ticket);
  absl::StatusOr<BeginResult> r = a.Await(absl::Milliseconds(100));
  EXPECT_TRUE(absl::IsCancelled(r.status())) << r.status();
  EXPECT_EQ(waiters_->parked(), 0);
  // A second cancel, or one of a Begin that never parked, answers nothing.
  waiters_->Cancel(ticket);
  EXPECT_EQ(a.answers(), 1);
}

TEST_F(BeginWaitersTest, ABeginCancelledBeforeItParksNeverParks) {
  const RecordKey key{"t", "pay", "k6"};
  Hold(key, absl::Minutes(10));
  auto ticket = BeginWaiters::NewTicket();
  waiters_->Cancel(ticket);
  BeginAnswer a;
  Park(ticket, key, Cmd("h", absl::Seconds(30)), absl::Hours(1), &a);
  absl::StatusOr<BeginResult> r = a.Await(absl::Milliseconds(100));
  EXPECT_TRUE(absl::IsCancelled(r.status())) << r.status();
  EXPECT_EQ(waiters_->parked(), 0);
}

TEST_F(BeginWaitersTest, ShutdownAnswersEveryParkedBeginInProgress) {
  const RecordKey key{"t", "pay", "k7"};
  Hold(key, absl::Minutes(10));
  std::vector<BeginAnswer> answers(3);
  for (BeginAnswer& a : answers) {
    Park(BeginWaiters::NewTicket(), key, Cmd("h", absl::Seconds(30)),
         absl::Hours(1), &a);
  }
  waiters_->Shutdown();
  for (BeginAnswer& a : answers) {
    absl::StatusOr<BeginResult> r = a.Await(absl::Milliseconds(100));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->outcome, Outcome::kInProgress);
  }
  // And none parks from now on.
  BeginAnswer late;
  Park(BeginWaiters::NewTicket(), key, Cmd("h", absl::Seconds(30)),
       absl::Hours(1), &late);
  absl::StatusOr<BeginResult> r = late.Await(absl::Milliseconds(100));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->outcome, Outcome::kInProgress);
}

// Woken together, parked Begins of two commands share a decision per
// command: after a retryable failure, that decision writes, and of all the
// Begins it sends back to the store exactly one takes the key; the rest
// park again and get the new holder's replay.
TEST_F(BeginWaitersTest, ARetryableFailureLetsExactlyOneParkedBeginIn) {
  const RecordKey key{"t", "pay", "k9"};
  const int64_t token = Hold(key, absl::Minutes(10));
  constexpr int kWaiters = 20;
  std::vector<BeginAnswer> answers(kWaiters);
  for (int i = 0; i < kWaiters; ++i) {
    Park(BeginWaiters::NewTicket(), key,
         Cmd("h", absl::Seconds(i % 2 == 0 ? 30 : 60)), absl::Hours(1),
         &answers[i]);
  }
  ASSERT_EQ(waiters_->parked(), kWaiters);

  FailCommand fail;
  fail.fencing_token = token;
  fail.retryable = true;
  fail.error.code = 503;
  ASSERT_TRUE(coordinator_.Fail(key, fail).ok());
  const SteadyTime until = SteadyDeadline(absl::Seconds(10));
  BeginAnswer* winner = nullptr;
  while (winner == nullptr && SteadyClock::now() < until) {
    for (BeginAnswer& a : answers) {
      if (a.answered()) winner = &a;
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_NE(winner, nullptr) << "no parked Begin took the key";
  absl::StatusOr<BeginResult> won = winner->Await();
  ASSERT_TRUE(won.ok()) << won.status();
  ASSERT_EQ(won->outcome, Outcome::kAcquired);
  EXPECT_EQ(won->record->fencing_token, token + 1);
  // The others decided IN_PROGRESS on the store and parked again.
  const SteadyTime parked_until = SteadyDeadline(absl::Seconds(10));
  while (waiters_->parked() != kWaiters - 1 &&
         SteadyClock::now() < parked_until) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ(waiters_->parked(), kWaiters - 1);
  for (BeginAnswer& a : answers) {
    if (&a != winner) {
      EXPECT_FALSE(a.answered());
    }
  }

  Complete(key, won->record->fencing_token);
  for (BeginAnswer& a : answers) {
    if (&a != winner) ExpectCompletedOnce(a, "paid");
  }
  EXPECT_EQ(waiters_->parked(), 0);
}

TEST_F(BeginWaitersTest, AnAnswerThatNeedsNoWaitIsGivenAtOnce) {
  const RecordKey key{"t", "pay", "k8"};
  BeginAnswer a;
  Park(BeginWaiters::NewTicket(), key, Cmd("h", absl::Seconds(30)),
       absl::Hours(1), &a);
  absl::StatusOr<BeginResult> r = a.Await(absl::Milliseconds(100));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->outcome, Outcome::kAcquired);
  EXPECT_EQ(waiters_->parked(), 0);
}

class BeginWaitersBoundsTest : public BeginWaitersTest {
 protected:
  BeginWaitersBoundsTest() : BeginWaitersTest(WaiterLimits{2, 3, 4}) {}

  // Parks a Begin on `key`; returns its answer if it came at once.
  absl::StatusOr<BeginResult> TryPark(const RecordKey& key) {
    answers_.push_back(std::make_unique<BeginAnswer>());
    Park(BeginWaiters::NewTicket(), key, Cmd("h", absl::Seconds(30)),
         absl::Hours(1), answers_.back().get());
    return answers_.back()->Await(absl::Milliseconds(50));
  }

  std::vector<std::unique_ptr<BeginAnswer>> answers_;
};

TEST_F(BeginWaitersBoundsTest, EachBoundRefusesWithTheFlagItNames) {
  const RecordKey a1{"a", "pay", "1"}, a2{"a", "pay", "2"};
  const RecordKey b1{"b", "pay", "1"}, b2{"b", "pay", "2"};
  for (const RecordKey* k : {&a1, &a2, &b1, &b2}) Hold(*k, absl::Minutes(10));
  // Two per key.
  EXPECT_TRUE(absl::IsDeadlineExceeded(TryPark(a1).status()));
  EXPECT_TRUE(absl::IsDeadlineExceeded(TryPark(a1).status()));
  absl::Status per_key = TryPark(a1).status();
  EXPECT_TRUE(absl::IsResourceExhausted(per_key)) << per_key;
  EXPECT_NE(per_key.message().find("--max-waiters-per-key=2"),
            std::string::npos)
      << per_key;
  // Three per tenant.
  EXPECT_TRUE(absl::IsDeadlineExceeded(TryPark(a2).status()));
  absl::Status per_tenant = TryPark(a2).status();
  EXPECT_TRUE(absl::IsResourceExhausted(per_tenant)) << per_tenant;
  EXPECT_NE(per_tenant.message().find("--max-waiters-per-tenant=3"),
            std::string::npos)
      << per_tenant;
  // Four in all.
  EXPECT_TRUE(absl::IsDeadlineExceeded(TryPark(b1).status()));
  absl::Status total = TryPark(b2).status();
  EXPECT_TRUE(absl::IsResourceExhausted(total)) << total;
  EXPECT_NE(total.message().find("--max-waiters=4"), std::string::npos)
      << total;
  EXPECT_EQ(waiters_->parked(), 4);
}

}  // namespace
}  // namespace idem
