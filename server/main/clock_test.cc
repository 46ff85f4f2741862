// The timed waits of the background loops, the PostgreSQL pool and the
// timer queue run on the steady clock. CTest also runs this binary under
// `faketime -f -1h` (wall clock an hour behind the kernel's, as after a
// backward step): with waits on the wall clock, every one of them returned
// at once there, the loops spun and the pool gave up without waiting.
#include "absl/time/clock.h"

#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <fstream>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/steady_wait.h"
#include "gtest/gtest.h"
#include "server/base/config.h"
#include "server/core/coordinator.h"
#include "server/core/maintenance.h"
#include "server/core/reconciler.h"
#include "server/postgres/pg_listener.h"
#include "server/postgres/pg_pool.h"
#include "server/rpc/auth.h"
#include "server/rpc/health.h"
#include "server/store/change_feed.h"
#include "server/store/memory_store.h"

namespace idem {
namespace {

// How long `fn` takes on the steady clock.
template <typename Fn>
absl::Duration Took(Fn fn) {
  const SteadyTime start = SteadyClock::now();
  fn();
  return SteadySince(start);
}

// CPU time used by this process so far.
absl::Duration CpuTime() {
  rusage u = {};
  getrusage(RUSAGE_SELF, &u);
  return absl::DurationFromTimeval(u.ru_utime) +
         absl::DurationFromTimeval(u.ru_stime);
}

// A memory store that counts the calls of the background loops.
class CountingStore : public StoreWrapper {
 public:
  CountingStore() : StoreWrapper(NewMemoryStore()) {}

  absl::Status Ping() override {
    ++pings;
    return StoreWrapper::Ping();
  }
  absl::StatusOr<std::vector<Record>> ExpireLeases(
      int limit, const ExpireFn& expire) override {
    ++reaps;
    return StoreWrapper::ExpireLeases(limit, expire);
  }
  absl::StatusOr<std::vector<ReconcileClaim>> ClaimUnknown(
      const std::map<std::string, int>& max_attempts, absl::Duration backoff,
      absl::Duration max_backoff, int limit) override {
    ++claims;
    return StoreWrapper::ClaimUnknown(max_attempts, backoff, max_backoff,
                                      limit);
  }

  std::atomic<int> pings{0};
  std::atomic<int> reaps{0};
  std::atomic<int> claims{0};
};

class NullHealth : public grpc::HealthCheckServiceInterface {
 public:
  void SetServingStatus(const std::string&, bool) override {}
  void SetServingStatus(bool) override {}
};

// A TCP port that accepts connections (the kernel does) and never answers:
// a PostgreSQL client hangs there until its connect timeout.
class SilentPort {
 public:
  SilentPort() : fd_(socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in addr = {};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (bind(fd_, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
        listen(fd_, 16) != 0 ||
        getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      ADD_FAILURE() << "cannot listen on 127.0.0.1";
    }
    port_ = ntohs(addr.sin_port);
  }
  ~SilentPort() { close(fd_); }
  int port() const { return port_; }

 private:
  const int fd_;
  int port_ = 0;
};

TEST(ClockTest, BackgroundLoopsWaitTheirIntervals) {
  CountingStore store;
  NullHealth health;
  absl::StatusOr<PolicySet> policies =
      ParsePolicies("operations: {refund: {probe: \"127.0.0.1:1\"}}");
  ASSERT_TRUE(policies.ok()) << policies.status();
  Coordinator coordinator(&store, &*policies);
  const std::string tokens = ::testing::TempDir() + "/clock-tokens.json";
  std::ofstream(tokens) << R"({"principals": [{"name": "a",
      "token": "tok-0123456789abcdef", "tenants": ["t"]}]})";
  ChangeFeed feed;

  const absl::Duration interval = absl::Milliseconds(200);
  const absl::Duration cpu_before = CpuTime();
  const absl::Duration took = Took([&] {
    HealthMonitor monitor(&store, &health, interval);
    MaintenanceOptions maintenance;
    maintenance.reaper_interval = interval;
    maintenance.purge_interval = interval;
    maintenance.stats_interval = interval;
    Maintenance background(&store, &*policies, maintenance, {});
    ReconcilerOptions reconcile;
    reconcile.interval = interval;
    Reconciler reconciler(&store, &coordinator, &*policies, nullptr, reconcile);
    reconciler.Start();
    absl::StatusOr<std::unique_ptr<Authenticator>> auth =
        Authenticator::Create(tokens);
    ASSERT_TRUE(auth.ok()) << auth.status();
    // Nothing listens on port 1: it reconnects with backoff.
    PgListener listener("host=127.0.0.1 port=1 dbname=idem user=idem", &feed);
    std::this_thread::sleep_for(std::chrono::seconds(1));
  });
  const absl::Duration cpu = CpuTime() - cpu_before;
  // About one round per interval, plus the first: 5-6 in a second. A loop
  // whose wait returns at once makes thousands.
  const int max_rounds = static_cast<int>(took / interval) + 3;
  EXPECT_GE(store.pings.load(), 3);
  EXPECT_LE(store.pings.load(), max_rounds);
  EXPECT_GE(store.reaps.load(), 3);
  EXPECT_LE(store.reaps.load(), max_rounds);
  EXPECT_GE(store.claims.load(), 3);
  EXPECT_LE(store.claims.load(), max_rounds);
  // Idle loops cost next to nothing; one spinning costs a core.
  EXPECT_LT(cpu, absl::Milliseconds(400)) << "in " << took;
}

TEST(ClockTest, PoolWaitsForAFreeConnection) {
  SilentPort silent;
  PgOptions options;
  options.conninfo = absl::StrCat("host=127.0.0.1 port=", silent.port(),
                                  " dbname=idem user=idem");
  options.pool_size = 1;
  options.connect_timeout = absl::Seconds(2);
  options.acquire_timeout = absl::Milliseconds(300);
  PgPool pool(options);
  // Holds the only connection slot while connecting to a server that never
  // answers (until the 2 s connect timeout).
  std::thread holder(
      [&] { EXPECT_FALSE(pool.Run("hold", [](pqxx::connection&) {}).ok()); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  absl::Status waited;
  const absl::Duration took =
      Took([&] { waited = pool.Run("wait", [](pqxx::connection&) {}); });
  holder.join();
  EXPECT_EQ(waited.code(), absl::StatusCode::kUnavailable) << waited;
  EXPECT_NE(waited.message().find("no PostgreSQL connection free"),
            std::string::npos)
      << waited;
  EXPECT_GE(took, absl::Milliseconds(300));
  EXPECT_LT(took, absl::Milliseconds(1500));
}

}  // namespace
}  // namespace idem
