// HealthMonitor: statuses follow the store's pings, and Stop() turns every
// status NOT_SERVING at once, even while a ping hangs on a store that does
// not answer (a paused PostgreSQL during a SIGTERM).
#include "server/rpc/health.h"

#include <map>
#include <string>
#include <thread>

#include "common/steady_wait.h"
#include "gtest/gtest.h"
#include "server/store/memory_store.h"

namespace idem {
namespace {

// A memory store whose pings fail on demand or block until released.
class GatedPingStore : public StoreWrapper {
 public:
  GatedPingStore() : StoreWrapper(NewMemoryStore()) {}

  absl::Status Ping() override {
    {
      SteadyMutexLock lock(&mu_);
      ++pings_;
      cv_.SignalAll();
      cv_.WaitFor(&lock, absl::Seconds(30),
                  [this]()
                      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !blocked_; });
      if (failing_) return absl::UnavailableError("store down");
    }
    return StoreWrapper::Ping();
  }

  void Block(bool blocked) {
    SteadyMutexLock lock(&mu_);
    blocked_ = blocked;
    cv_.SignalAll();
  }
  void Fail(bool failing) {
    SteadyMutexLock lock(&mu_);
    failing_ = failing;
  }
  // Waits until Ping() has been entered more than `n` times.
  bool WaitForPings(int n, absl::Duration timeout) {
    SteadyMutexLock lock(&mu_);
    return cv_.WaitUntil(
        &lock, SteadyDeadline(timeout),
        [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pings_ > n; });
  }
  int pings() {
    SteadyMutexLock lock(&mu_);
    return pings_;
  }

 private:
  SteadyMutex mu_;
  SteadyCondVar cv_;
  bool blocked_ ABSL_GUARDED_BY(mu_) = false;
  bool failing_ ABSL_GUARDED_BY(mu_) = false;
  int pings_ ABSL_GUARDED_BY(mu_) = 0;
};

// Records the last status set per service name.
class RecordingHealth : public grpc::HealthCheckServiceInterface {
 public:
  void SetServingStatus(const std::string& name, bool serving) override {
    SteadyMutexLock lock(&mu_);
    status_[name] = serving;
  }
  void SetServingStatus(bool serving) override {
    SteadyMutexLock lock(&mu_);
    for (auto& [name, s] : status_) s = serving;
  }
  // -1 unset, 0 NOT_SERVING, 1 SERVING.
  int Of(const std::string& name) {
    SteadyMutexLock lock(&mu_);
    auto it = status_.find(name);
    return it == status_.end() ? -1 : it->second;
  }

 private:
  SteadyMutex mu_;
  std::map<std::string, bool> status_ ABSL_GUARDED_BY(mu_);
};

constexpr absl::Duration kInterval = absl::Milliseconds(20);

// Polls until `name` has status `want` (see RecordingHealth::Of).
bool WaitForStatus(RecordingHealth& health, const std::string& name, int want) {
  const SteadyTime deadline = SteadyDeadline(absl::Seconds(5));
  while (health.Of(name) != want && SteadyClock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return health.Of(name) == want;
}

// The constructor does not wait for the store: until the first ping answers,
// everything but liveness is NOT_SERVING (gRPC itself starts "" as SERVING).
TEST(HealthMonitorTest, NotServingUntilTheFirstPingAnswers) {
  GatedPingStore store;
  store.Block(true);
  RecordingHealth health;
  health.SetServingStatus("", true);
  HealthMonitor monitor(&store, &health, kInterval);
  EXPECT_EQ(health.Of(""), 0);
  EXPECT_EQ(health.Of("idempotency.v1.Idempotency"), 0);
  EXPECT_EQ(health.Of("idempotency.v1.IdempotencyAdmin"), 0);
  EXPECT_EQ(health.Of(kLivenessService), 1);
  ASSERT_TRUE(store.WaitForPings(0, absl::Seconds(5)));
  EXPECT_EQ(health.Of(""), 0);
  store.Block(false);
  // The last name a check sets.
  EXPECT_TRUE(WaitForStatus(health, "idempotency.v1.IdempotencyAdmin", 1));
  EXPECT_EQ(health.Of(""), 1);
  EXPECT_EQ(health.Of("idempotency.v1.Idempotency"), 1);
}

TEST(HealthMonitorTest, FollowsThePingsAndLivenessStaysServing) {
  GatedPingStore store;
  RecordingHealth health;
  HealthMonitor monitor(&store, &health, kInterval);
  ASSERT_TRUE(WaitForStatus(health, "idempotency.v1.IdempotencyAdmin", 1));
  EXPECT_EQ(health.Of("idempotency.v1.Idempotency"), 1);
  EXPECT_EQ(health.Of(kLivenessService), 1);

  store.Fail(true);
  ASSERT_TRUE(store.WaitForPings(store.pings() + 1, absl::Seconds(5)));
  EXPECT_EQ(health.Of(""), 0);
  EXPECT_EQ(health.Of("idempotency.v1.IdempotencyAdmin"), 0);
  EXPECT_EQ(health.Of(kLivenessService), 1);

  store.Fail(false);
  ASSERT_TRUE(store.WaitForPings(store.pings() + 1, absl::Seconds(5)));
  EXPECT_EQ(health.Of(""), 1);
  monitor.Stop();
  EXPECT_EQ(health.Of(""), 0);
  EXPECT_EQ(health.Of(kLivenessService), 0);
}

TEST(HealthMonitorTest, StopIsImmediateWhileAPingHangs) {
  GatedPingStore store;
  RecordingHealth health;
  HealthMonitor monitor(&store, &health, kInterval);
  store.Block(true);
  ASSERT_TRUE(store.WaitForPings(store.pings(), absl::Seconds(5)));
  std::thread stop([&] { monitor.Stop(); });
  // Stop() waits for the hanging ping to end the thread, but the statuses
  // change before that.
  EXPECT_TRUE(WaitForStatus(health, kLivenessService, 0));
  EXPECT_EQ(health.Of(""), 0);
  EXPECT_EQ(health.Of("idempotency.v1.Idempotency"), 0);
  // The ping then succeeds; its result must not turn anything back on.
  store.Block(false);
  stop.join();
  EXPECT_EQ(health.Of(""), 0);
  EXPECT_EQ(health.Of("idempotency.v1.Idempotency"), 0);
  EXPECT_EQ(health.Of(kLivenessService), 0);
}

}  // namespace
}  // namespace idem
