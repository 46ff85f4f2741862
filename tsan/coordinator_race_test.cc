// Many threads race Begin (with and without `wait`), Heartbeat, Complete,
// Fail, Get, Resolve, the reaper and the purger over a few records at a time
// of one memory store, through a Coordinator and, for the Begins that wait,
// Calls as the services run them, with a shared fake clock that runs fast
// enough for leases to expire mid-run. Checks docs/spec.md #guarantees from
// the outside: G1 (one owner per fencing token, tokens 1, 2, 3, ... with no
// gap), G3 (an acknowledged Complete's snapshot is what the record holds)
// and G5 (a write acknowledged under a token names that token). Needs no
// sanitizer; under ThreadSanitizer it is the data race test of the
// coordinator, the memory store, the change feed and the parked Begins.
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/steady_wait.h"
#include "gtest/gtest.h"
#include "server/base/config.h"
#include "server/base/log.h"
#include "server/core/calls.h"
#include "server/core/coordinator.h"
#include "server/core/sync_calls.h"
#include "server/metrics/metrics.h"
#include "server/store/memory_store.h"
#include "statemachine/transitions.h"

namespace idem {
namespace {

constexpr int kWorkers = 6;
constexpr int kRoundsPerWorker = 3000;
// Records raced on at any time; a slot moves on to a new record once its
// record is finished for good, so that the race never settles.
constexpr int kSlots = 6;
constexpr char kUnknownOp[] = "op-unknown";
constexpr char kReleaseOp[] = "op-release";

// A clock shared by all threads; advanced by the ticker and by workers.
class FakeClock {
 public:
  absl::Time Now() const {
    return absl::FromUnixMicros(micros_.load(std::memory_order_relaxed));
  }
  void Advance(absl::Duration d) {
    micros_.fetch_add(absl::ToInt64Microseconds(d), std::memory_order_relaxed);
  }

 private:
  std::atomic<int64_t> micros_{1700000000LL * 1000000};
};

// Everything the threads observed, checked at the end.
class Observations {
 public:
  // A Begin answered ACQUIRED with `token` to `attempt_id`.
  void Granted(const RecordKey& key, int64_t token,
               const std::string& attempt_id) {
    SteadyMutexLock lock(&mu_);
    auto [it, inserted] =
        grants_.emplace(std::make_pair(KeyName(key), token), attempt_id);
    if (!inserted && it->second != attempt_id) {
      violations_.push_back(absl::StrCat("G1: ", KeyName(key), " token ", token,
                                         " granted to ", it->second, " and to ",
                                         attempt_id));
    }
  }

  void Violation(std::string what) {
    SteadyMutexLock lock(&mu_);
    violations_.push_back(std::move(what));
  }

  void Count(const std::string& what) {
    SteadyMutexLock lock(&mu_);
    ++counts_[what];
  }

  // Every record some Begin was granted.
  std::set<std::string> GrantedKeys() {
    SteadyMutexLock lock(&mu_);
    std::set<std::string> out;
    for (const auto& [k, attempt] : grants_) out.insert(k.first);
    return out;
  }

  // Tokens granted for `key`, sorted.
  std::vector<int64_t> TokensOf(const RecordKey& key) {
    SteadyMutexLock lock(&mu_);
    std::vector<int64_t> out;
    for (const auto& [k, attempt] : grants_) {
      if (k.first == KeyName(key)) out.push_back(k.second);
    }
    return out;
  }

  std::vector<std::string> violations() {
    SteadyMutexLock lock(&mu_);
    return violations_;
  }
  std::map<std::string, int> counts() {
    SteadyMutexLock lock(&mu_);
    return counts_;
  }

  static std::string KeyName(const RecordKey& k) {
    return absl::StrCat(k.tenant, "/", k.operation, "/", k.key);
  }

 private:
  SteadyMutex mu_;
  std::map<std::pair<std::string, int64_t>, std::string> grants_
      ABSL_GUARDED_BY(mu_);
  std::vector<std::string> violations_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> counts_ ABSL_GUARDED_BY(mu_);
};

class CoordinatorRaceTest : public ::testing::Test {
 protected:
  CoordinatorRaceTest() {
    SetLogLevel(LogLevel::kError);
    Policy unknown;
    unknown.retention = absl::Hours(10000);  // never purged during the run
    unknown.on_lease_expiry = ExpiryPolicy::kUnknown;
    Policy release = unknown;
    release.on_lease_expiry = ExpiryPolicy::kRelease;
    policies_ =
        PolicySet(unknown, {{kUnknownOp, unknown}, {kReleaseOp, release}});
    store_ = NewMemoryStore([this] { return clock_.Now(); });
    coordinator_ =
        std::make_unique<SyncCoordinator>(store_.get(), &policies_, &metrics_);
    calls_ = std::make_unique<Calls>(store_.get(), store_->Changes(),
                                     &policies_, &metrics_);
  }

  // Begin as the gRPC service runs it: with a wait, an IN_PROGRESS answer
  // parks in calls_; half of the parked ones are cancelled as their caller
  // would, at once.
  absl::StatusOr<BeginResult> BeginWaiting(const RecordKey& key,
                                           const BeginCommand& begin,
                                           absl::Duration wait, bool cancel) {
    if (wait <= absl::ZeroDuration()) return coordinator_->Begin(key, begin);
    std::mutex mu;
    absl::StatusOr<BeginResult> out = absl::UnknownError("none");
    SteadyNotification done;
    std::shared_ptr<Calls::Wait> waiting =
        calls_->NewWait(SteadyDeadline(wait));
    calls_->Begin(key, begin, waiting, [&](absl::StatusOr<BeginResult> r) {
      std::lock_guard<std::mutex> lock(mu);
      out = std::move(r);
      done.Notify();
    });
    if (cancel) calls_->Cancel(waiting);
    if (!done.WaitForNotificationWithTimeout(absl::Seconds(60))) {
      return absl::DeadlineExceededError("a parked Begin was never answered");
    }
    std::lock_guard<std::mutex> lock(mu);
    return out;
  }

  // The record slot `slot` races on now.
  RecordKey KeyOf(int slot) const {
    return KeyOf(slot, generation_[slot].load());
  }
  static RecordKey KeyOf(int slot, int generation) {
    return RecordKey{"tenant-a", slot % 2 == 0 ? kUnknownOp : kReleaseOp,
                     absl::StrCat("key-", slot, "-", generation)};
  }

  // One client: Begin, then maybe work and report, maybe vanish.
  void Worker(int id) {
    std::mt19937 rng(static_cast<uint32_t>(id) * 7919 + 1);
    auto pick = [&rng](int n) {
      return static_cast<int>(rng() % static_cast<uint32_t>(n));
    };
    // A token this worker held earlier, to try stale writes with.
    std::map<std::string, int64_t> old_tokens;
    for (int round = 0; round < kRoundsPerWorker; ++round) {
      const int slot = pick(kSlots);
      const int generation = generation_[slot].load();
      const RecordKey key = KeyOf(slot, generation);
      const std::string name = Observations::KeyName(key);
      BeginCommand begin;
      // Mostly the one request of this key; now and then another one.
      begin.request_hash = pick(20) == 0 ? "other-request" : "request";
      begin.lease = absl::Milliseconds(1 + pick(40));
      begin.attempt_id = absl::StrCat("w", id, "-r", round);
      const absl::Duration wait =
          pick(4) == 0 ? absl::Milliseconds(pick(5)) : absl::ZeroDuration();
      absl::StatusOr<BeginResult> r =
          BeginWaiting(key, begin, wait, /*cancel=*/pick(2) == 0);
      if (!r.ok()) {
        // Only a record changing 16 times in a row may refuse a Begin, and
        // a cancelled wait ends CANCELLED.
        if (!absl::IsAborted(r.status()) && !absl::IsCancelled(r.status())) {
          seen_.Violation(
              absl::StrCat("Begin ", name, ": ", r.status().ToString()));
        }
        continue;
      }
      seen_.Count(OutcomeName(r->outcome));
      if (r->outcome == Outcome::kMismatch) {
        if (r->record->request_hash == begin.request_hash) {
          seen_.Violation(
              absl::StrCat("MISMATCH with the same hash on ", name));
        }
        // A record of the other request: race on a new one.
        if (r->record->request_hash != "request") {
          int expected = generation;
          generation_[slot].compare_exchange_strong(expected, generation + 1);
        }
        continue;
      }
      if (r->outcome != Outcome::kAcquired) {
        if (pick(3) == 0) TryStale(key, old_tokens, pick);
        // A finished record replays forever: race on a new one.
        if (r->outcome == Outcome::kCompleted ||
            r->outcome == Outcome::kFailed) {
          int expected = generation;
          generation_[slot].compare_exchange_strong(expected, generation + 1);
        }
        continue;
      }
      const int64_t token = r->record->fencing_token;
      if (r->record->status != Status::kProcessing ||
          r->record->attempt_id != begin.attempt_id) {
        seen_.Violation(absl::StrCat(
            "ACQUIRED ", name, " token ", token, " but the record is ",
            StatusName(r->record->status), " held by ", r->record->attempt_id));
      }
      seen_.Granted(key, token, begin.attempt_id);
      // The same attempt asking again regains its grant while it is live.
      if (pick(8) == 0) {
        absl::StatusOr<BeginResult> again = coordinator_->Begin(key, begin);
        if (again.ok() && again->outcome == Outcome::kAcquired) {
          seen_.Granted(key, again->record->fencing_token, begin.attempt_id);
        }
      }
      if (pick(4) == 0) clock_.Advance(absl::Milliseconds(pick(30)));
      if (pick(3) == 0) {
        absl::StatusOr<Record> hb = coordinator_->Heartbeat(
            key, HeartbeatCommand{token, absl::Milliseconds(20)});
        if (hb.ok() && hb->fencing_token != token) {
          seen_.Violation(absl::StrCat("G5: heartbeat with ", token,
                                       " acknowledged on token ",
                                       hb->fencing_token));
        }
      }
      Finish(key, token, id, round, pick);
      old_tokens[name] = token;
    }
  }

  // Reports the attempt's end: Complete, Fail (final or retryable) or
  // nothing (the lease runs out).
  template <typename Pick>
  void Finish(const RecordKey& key, int64_t token, int id, int round,
              Pick& pick) {
    Snapshot snapshot;
    snapshot.code = 200 + pick(3);
    snapshot.body = absl::StrCat("result of w", id, "-r", round);
    switch (pick(5)) {
      case 0:
      case 1: {
        absl::StatusOr<Record> done =
            coordinator_->Complete(key, CompleteCommand{token, snapshot});
        if (done.ok()) {
          seen_.Count("Complete acknowledged");
          if (done->fencing_token != token || done->result != snapshot ||
              done->status != Status::kSucceeded) {
            seen_.Violation(absl::StrCat(
                "G3/G5: Complete with ", token, " acknowledged on ",
                StatusName(done->status), " token ", done->fencing_token,
                " holding ", done->result ? done->result->body : "nothing"));
          }
        } else if (!absl::IsFailedPrecondition(done.status())) {
          seen_.Violation(absl::StrCat("Complete: ", done.status().ToString()));
        }
        break;
      }
      case 2:
      case 3: {
        const bool retryable = pick(2) == 0;
        absl::StatusOr<Record> done =
            coordinator_->Fail(key, FailCommand{token, snapshot, retryable});
        if (done.ok() &&
            (done->fencing_token != token || done->status != Status::kFailed ||
             done->retryable != retryable)) {
          seen_.Violation(absl::StrCat("G5: Fail with ", token,
                                       " acknowledged on token ",
                                       done->fencing_token));
        }
        break;
      }
      default:
        seen_.Count("abandoned");
        break;
    }
  }

  // A report with a token this worker held before must never change a
  // record that moved on.
  template <typename Pick>
  void TryStale(const RecordKey& key,
                const std::map<std::string, int64_t>& old_tokens, Pick& pick) {
    auto it = old_tokens.find(Observations::KeyName(key));
    if (it == old_tokens.end()) return;
    Snapshot stale;
    stale.body = "stale";
    stale.code = pick(1000);
    absl::StatusOr<Record> done =
        coordinator_->Complete(key, CompleteCommand{it->second, stale});
    if (done.ok() && done->fencing_token != it->second) {
      seen_.Violation(absl::StrCat("G5: stale Complete with ", it->second,
                                   " acknowledged on token ",
                                   done->fencing_token));
    }
  }

  // Turns UNKNOWN records into retryable failures, as an operator would.
  void Operator() {
    int round = 0;
    while (!stop_.load()) {
      ListQuery q;
      q.status = Status::kUnknown;
      q.limit = 10;
      absl::StatusOr<std::vector<Record>> unknown = ListNow(*store_, q);
      if (unknown.ok()) {
        for (const Record& r : *unknown) {
          ResolveCommand cmd;
          cmd.to = Status::kFailed;
          cmd.retryable = true;
          cmd.reason = absl::StrCat("race test ", round);
          cmd.actor = "operator";
          cmd.expected_fencing_token = r.fencing_token;
          absl::StatusOr<Record> resolved = coordinator_->Resolve(r.key, cmd);
          if (resolved.ok()) seen_.Count("resolved");
        }
      }
      for (int slot = 0; slot < kSlots; ++slot) {
        (void)coordinator_->Get(KeyOf(slot));
      }
      ++round;
      std::this_thread::yield();
    }
  }

  // Checks that the tokens granted for `key` are 1..its current token, and
  // counts them into `acquisitions`.
  void CheckTokens(const RecordKey& key, int64_t* acquisitions);

  // The reaper and the purger, plus time running on.
  void Maintenance() {
    const ExpireFn expire = [this](const Record& r, absl::Time now) {
      return DecideExpire(r, now, policies_.For(r.key.operation), kActorReaper);
    };
    while (!stop_.load()) {
      clock_.Advance(absl::Milliseconds(1));
      absl::StatusOr<std::vector<Record>> expired =
          store_->ExpireLeases(4, expire);
      if (expired.ok()) {
        for (const Record& r : *expired) {
          seen_.Count("reaped");
          if (r.status == Status::kProcessing) {
            seen_.Violation("the reaper left a record PROCESSING");
          }
        }
      }
      (void)store_->Purge(10);
      (void)store_->Stats();
      std::this_thread::yield();
    }
  }

  FakeClock clock_;
  PolicySet policies_;
  Metrics metrics_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<SyncCoordinator> coordinator_;
  // Parked Begins; goes first: it waits for the store calls it started.
  std::unique_ptr<Calls> calls_;
  std::atomic<int> generation_[kSlots] = {};
  size_t keys_checked_ = 0;
  Observations seen_;
  std::atomic<bool> stop_{false};
};

TEST_F(CoordinatorRaceTest, OneOwnerPerTokenAndNoStaleWrites) {
  std::vector<std::thread> workers;
  for (int i = 0; i < kWorkers; ++i) {
    workers.emplace_back([this, i] { Worker(i); });
  }
  std::thread op([this] { Operator(); });
  std::thread maintenance([this] { Maintenance(); });
  for (std::thread& t : workers) t.join();
  stop_.store(true);
  op.join();
  maintenance.join();

  for (const std::string& v : seen_.violations()) ADD_FAILURE() << v;
  // Every acquisition was answered, so each record's tokens are exactly
  // 1..current (G1: the token grows by one at every acquisition).
  int64_t acquisitions = 0;
  for (int slot = 0; slot < kSlots; ++slot) {
    for (int generation = 0; generation <= generation_[slot].load();
         ++generation) {
      CheckTokens(KeyOf(slot, generation), &acquisitions);
    }
  }
  EXPECT_EQ(seen_.GrantedKeys().size(), keys_checked_);
  // The run must have raced something: grants, replays, expiries.
  std::map<std::string, int> counts = seen_.counts();
  EXPECT_GT(acquisitions, 50);
  EXPECT_GT(counts["IN_PROGRESS"], 0);
  EXPECT_GT(counts["Complete acknowledged"], 0);
  EXPECT_GT(counts["reaped"] + counts["UNKNOWN"], 0);
  for (const auto& [what, n] : counts) {
    std::printf("%-24s %d\n", what.c_str(), n);
  }
  std::printf("%-24s %lld\n", "records", static_cast<long long>(keys_checked_));
}

void CoordinatorRaceTest::CheckTokens(const RecordKey& key,
                                      int64_t* acquisitions) {
  absl::StatusOr<StoreRead> read = ReadNow(*store_, key);
  ASSERT_TRUE(read.ok());
  if (!read->record) return;
  ++keys_checked_;
  const std::vector<int64_t> tokens = seen_.TokensOf(key);
  std::vector<int64_t> expected;
  for (int64_t t = 1; t <= read->record->fencing_token; ++t) {
    expected.push_back(t);
  }
  EXPECT_EQ(tokens, expected) << Observations::KeyName(key);
  *acquisitions += static_cast<int64_t>(tokens.size());
}

}  // namespace
}  // namespace idem
