// The coordinator over the memory store with a fake clock: Begin's answers
// through a record's life, the holder's calls with and without a held
// record, Get and Resolve. The PostgreSQL store is covered by store_pgtest
// and the end-to-end tests; races by tsan/coordinator_race_test.
#include "server/core/coordinator.h"

#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "server/core/sync_calls.h"
#include "server/store/memory_store.h"

namespace idem {
namespace {

class CoordinatorTest : public ::testing::Test {
 protected:
  CoordinatorTest() {
    Policy unknown;
    Policy release;
    release.on_lease_expiry = ExpiryPolicy::kRelease;
    policies_ = PolicySet(unknown, {{"release", release}});
  }

  // Each call is another attempt (the same attempt asking again would
  // regain its grant).
  BeginCommand Cmd(const std::string& hash = "h",
                   absl::Duration lease = absl::Seconds(30)) {
    BeginCommand cmd;
    cmd.request_hash = hash;
    cmd.lease = lease;
    cmd.attempt_id = "attempt-" + std::to_string(++attempts_);
    return cmd;
  }
  static Snapshot Result(const std::string& body) {
    Snapshot s;
    s.code = 201;
    s.body = body;
    s.content_type = "application/json";
    s.headers = {{"location", "/p/1"}};
    return s;
  }
  absl::StatusOr<BeginResult> Begin(const RecordKey& key) {
    return coordinator_.Begin(key, Cmd());
  }
  absl::StatusOr<BeginResult> Begin(const RecordKey& key,
                                    const BeginCommand& cmd) {
    return coordinator_.Begin(key, cmd);
  }

  absl::Time now_ = absl::FromUnixSeconds(1'700'000'000);
  std::unique_ptr<Store> store_ = NewMemoryStore([this] { return now_; });
  PolicySet policies_;
  SyncCoordinator coordinator_{store_.get(), &policies_};
  const RecordKey key_{"t", "pay", "k"};
  int attempts_ = 0;
};

TEST_F(CoordinatorTest, ALifeFromAcquiredToReplay) {
  absl::StatusOr<BeginResult> grant = Begin(key_);
  ASSERT_TRUE(grant.ok()) << grant.status();
  EXPECT_EQ(grant->outcome, Outcome::kAcquired);
  EXPECT_EQ(grant->record->fencing_token, 1);

  absl::StatusOr<BeginResult> busy = Begin(key_);
  ASSERT_TRUE(busy.ok());
  EXPECT_EQ(busy->outcome, Outcome::kInProgress);
  EXPECT_GT(busy->retry_after, absl::ZeroDuration());
  EXPECT_EQ(busy->lease_left, absl::Seconds(30));

  absl::StatusOr<Record> done =
      coordinator_.Complete(key_, CompleteCommand{1, Result("paid")});
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->status, Status::kSucceeded);

  absl::StatusOr<BeginResult> replay = Begin(key_);
  ASSERT_TRUE(replay.ok());
  EXPECT_EQ(replay->outcome, Outcome::kCompleted);
  EXPECT_EQ(replay->record->result, Result("paid"));

  absl::StatusOr<BeginResult> other = Begin(key_, Cmd("other"));
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->outcome, Outcome::kMismatch);

  absl::StatusOr<Record> got = coordinator_.Get(key_);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->result, Result("paid"));
}

TEST_F(CoordinatorTest, AStaleTokenChangesNothing) {
  ASSERT_TRUE(Begin(key_).ok());
  absl::Status stale =
      coordinator_.Complete(key_, CompleteCommand{7, Result("x")}).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(stale)) << stale;
  absl::StatusOr<Record> got = coordinator_.Get(key_);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->status, Status::kProcessing);
  EXPECT_FALSE(got->result.has_value());
}

TEST_F(CoordinatorTest, ARetryableFailureLetsTheNextBeginInWithToken2) {
  ASSERT_TRUE(Begin(key_).ok());
  FailCommand fail;
  fail.fencing_token = 1;
  fail.error = Result("upstream 503");
  fail.retryable = true;
  ASSERT_TRUE(coordinator_.Fail(key_, fail).ok());
  absl::StatusOr<BeginResult> again = Begin(key_);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->outcome, Outcome::kAcquired);
  EXPECT_EQ(again->record->fencing_token, 2);
}

TEST_F(CoordinatorTest, AnExpiredLeaseIsUnknownAndNeverGrantedAgain) {
  ASSERT_TRUE(Begin(key_, Cmd("h", absl::Seconds(5))).ok());
  now_ += absl::Seconds(6);
  absl::StatusOr<BeginResult> after = Begin(key_);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->outcome, Outcome::kUnknown);
  // The late holder's report settles it, audited; nobody runs it twice.
  absl::StatusOr<Record> late =
      coordinator_.Complete(key_, CompleteCommand{1, Result("late")});
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_EQ(late->status, Status::kSucceeded);
  absl::StatusOr<BeginResult> replay = Begin(key_);
  ASSERT_TRUE(replay.ok());
  EXPECT_EQ(replay->outcome, Outcome::kCompleted);
}

TEST_F(CoordinatorTest, UnderTheReleasePolicyAnExpiredLeaseIsTakenOver) {
  const RecordKey key{"t", "release", "k"};
  ASSERT_TRUE(Begin(key, Cmd("h", absl::Seconds(5))).ok());
  now_ += absl::Seconds(6);
  absl::StatusOr<BeginResult> next = Begin(key);
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->outcome, Outcome::kAcquired);
  EXPECT_EQ(next->record->fencing_token, 2);
  absl::Status old =
      coordinator_.Complete(key, CompleteCommand{1, Result("x")}).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(old)) << old;
}

TEST_F(CoordinatorTest, HeartbeatExtendsTheLease) {
  ASSERT_TRUE(Begin(key_, Cmd("h", absl::Seconds(5))).ok());
  now_ += absl::Seconds(4);
  absl::StatusOr<Record> hb =
      coordinator_.Heartbeat(key_, HeartbeatCommand{1, absl::Seconds(10)});
  ASSERT_TRUE(hb.ok()) << hb.status();
  EXPECT_EQ(hb->lease_expires_at, now_ + absl::Seconds(10));
  now_ += absl::Seconds(6);
  absl::StatusOr<BeginResult> busy = Begin(key_);
  ASSERT_TRUE(busy.ok());
  EXPECT_EQ(busy->outcome, Outcome::kInProgress);
}

// Counts the reads that reach the store.
class ReadCountingStore final : public StoreWrapper {
 public:
  using StoreWrapper::StoreWrapper;
  void Read(const RecordKey& key, ReadFn done) override {
    ++reads;
    StoreWrapper::Read(key, std::move(done));
  }
  int reads = 0;
};

TEST_F(CoordinatorTest, AHoldersCallDecidesOnTheRecordItHoldsWithoutARead) {
  ReadCountingStore counting(NewMemoryStore([this] { return now_; }));
  SyncCoordinator holder(&counting, &policies_);
  absl::StatusOr<BeginResult> grant = holder.Begin(key_, Cmd());
  ASSERT_TRUE(grant.ok());
  ASSERT_EQ(grant->outcome, Outcome::kAcquired);
  absl::StatusOr<Record> beat =
      holder.Heartbeat(key_, HeartbeatCommand{1, absl::Seconds(10)});
  ASSERT_TRUE(beat.ok()) << beat.status();
  absl::StatusOr<Record> done =
      holder.Complete(key_, CompleteCommand{1, Result("paid")});
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->status, Status::kSucceeded);
  EXPECT_EQ(counting.reads, 0);
}

TEST_F(CoordinatorTest, AStaleHeldRecordIsReadAgainBeforeAnswering) {
  ReadCountingStore counting(NewMemoryStore([this] { return now_; }));
  SyncCoordinator holder(&counting, &policies_);
  SyncCoordinator other(&counting, &policies_);
  ASSERT_EQ(holder.Begin(key_, Cmd())->outcome, Outcome::kAcquired);
  // Another instance completes the record with the holder's token (the
  // holder's retry reached it): the holder's copy is now stale.
  ASSERT_TRUE(other.Complete(key_, CompleteCommand{1, Result("paid")}).ok());
  const int reads = counting.reads;
  absl::StatusOr<Record> retried =
      holder.Complete(key_, CompleteCommand{1, Result("paid")});
  EXPECT_GT(counting.reads, reads);
  // The same answer as from an instance that held nothing.
  SyncCoordinator fresh(&counting, &policies_);
  absl::StatusOr<Record> expected =
      fresh.Complete(key_, CompleteCommand{1, Result("paid")});
  ASSERT_EQ(retried.status(), expected.status());
  if (retried.ok()) {
    EXPECT_EQ(retried->status, Status::kSucceeded);
    EXPECT_EQ(retried->result, expected->result);
  }
}

TEST_F(CoordinatorTest, ATenantCapIsCountedBeforeANewRecord) {
  CoordinatorOptions capped;
  capped.max_processing_per_tenant = 1;
  SyncCoordinator coordinator(store_.get(), &policies_, nullptr, capped);
  ASSERT_EQ(coordinator.Begin(key_, Cmd())->outcome, Outcome::kAcquired);
  // The same key is not a new record: no count refuses it.
  EXPECT_EQ(coordinator.Begin(key_, Cmd())->outcome, Outcome::kInProgress);
  absl::StatusOr<BeginResult> second =
      coordinator.Begin(RecordKey{"t", "pay", "k2"}, Cmd());
  EXPECT_TRUE(absl::IsResourceExhausted(second.status())) << second.status();
  // Another tenant has its own count.
  EXPECT_EQ(coordinator.Begin(RecordKey{"u", "pay", "k2"}, Cmd())->outcome,
            Outcome::kAcquired);
}

TEST_F(CoordinatorTest, WokenBeginsDecideOnASharedReadWithoutWriting) {
  ASSERT_TRUE(Begin(key_).ok());
  absl::StatusOr<StoreRead> read = ReadNow(*store_, key_);
  ASSERT_TRUE(read.ok());
  std::optional<absl::StatusOr<BeginResult>> busy =
      coordinator_.DecideWoken(key_, Cmd(), *read);
  ASSERT_TRUE(busy.has_value());
  ASSERT_TRUE(busy->ok());
  EXPECT_EQ((*busy)->outcome, Outcome::kInProgress);
  // Once the lease is out the decision writes: not a woken decision's job.
  now_ += absl::Minutes(1);
  read = ReadNow(*store_, key_);
  ASSERT_TRUE(read.ok());
  EXPECT_FALSE(coordinator_.DecideWoken(key_, Cmd(), *read).has_value());
}

TEST_F(CoordinatorTest, ResolveSettlesAnUnknownRecordOnce) {
  ASSERT_TRUE(Begin(key_, Cmd("h", absl::Seconds(5))).ok());
  now_ += absl::Seconds(6);
  ASSERT_EQ(Begin(key_)->outcome, Outcome::kUnknown);
  ResolveCommand resolve;
  resolve.to = Status::kSucceeded;
  resolve.result = Result("checked by hand");
  resolve.reason = "ledger shows the payment";
  resolve.actor = "ops";
  absl::StatusOr<Record> resolved = coordinator_.Resolve(key_, resolve);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(resolved->status, Status::kSucceeded);
  EXPECT_EQ(resolved->resolved_by, "ops");
  absl::StatusOr<BeginResult> replay = Begin(key_);
  ASSERT_TRUE(replay.ok());
  EXPECT_EQ(replay->outcome, Outcome::kCompleted);
  EXPECT_EQ(replay->record->result, Result("checked by hand"));
}

TEST_F(CoordinatorTest, GetOfAMissingRecordIsNotFound) {
  EXPECT_TRUE(absl::IsNotFound(coordinator_.Get(key_).status()));
}

}  // namespace
}  // namespace idem
