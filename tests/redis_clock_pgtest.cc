// The Redis client's pool wait, monitor and circuit breaker run on the
// steady clock: a forward step of the wall clock while a call waits for a
// pooled connection neither fails that call nor opens the breaker. CTest
// runs this binary with libfaketime preloaded, reading its offset from the
// file named by FAKETIME_TIMESTAMP_FILE at every clock read, so the test
// moves the process's wall clock by writing that file (as
// pool_clock_pgtest does). libfaketime fakes the process's clock reads, not
// the kernel's clock: Abseil's timed waits hand the kernel an absolute
// CLOCK_REALTIME deadline, so a deadline read 2 h behind the kernel's clock
// is what a wait sees when the host's clock steps 2 h forward just after
// the deadline was taken: it has passed at once.
#include <csignal>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/steady_wait.h"
#include "gtest/gtest.h"
#include "server/cache/redis_client.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/redis_server.h"

namespace idem {
namespace {

using ::idem::testing::RedisServer;
using ::idem::testing::SetWallClockOffset;
using ::idem::testing::WallClockStepsWork;

// One pooled connection, busy with a call Redis answers only after a
// second (it is stopped meanwhile); a second call waits for it with its
// wall clock 2 h behind the kernel's, far more than the 3 s timeout. On the
// wall clock that wait ended at once with DEADLINE_EXCEEDED.
TEST(RedisClockTest, AForwardWallClockStepLeavesCallsAndTheBreakerAlone) {
  ASSERT_TRUE(WallClockStepsWork())
      << "run through ctest: it preloads libfaketime and sets "
         "FAKETIME_TIMESTAMP_FILE";
  signal(SIGPIPE, SIG_IGN);
  // The server keeps the real clock.
  unsetenv("LD_PRELOAD");
  absl::StatusOr<std::unique_ptr<RedisServer>> redis = RedisServer::Start();
  ASSERT_TRUE(redis.ok()) << redis.status();

  RedisOptions options;
  options.address.host = "127.0.0.1";
  options.address.port = (*redis)->port();
  options.address_text = (*redis)->Address();
  options.timeout = absl::Seconds(3);
  options.pool_size = 1;
  options.ping_interval = absl::Hours(1);
  absl::Mutex mu;
  int ups = 0;
  int downs = 0;
  std::unique_ptr<RedisClient> client =
      NewRedisClient(options, [&mu, &ups, &downs](bool up) {
        absl::MutexLock lock(&mu);
        ++(up ? ups : downs);
      });
  {
    absl::MutexLock lock(&mu);
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(
                                        +[](int* n) { return *n > 0; }, &ups),
                                    absl::Seconds(10)));
  }
  ASSERT_TRUE(client->SetMany({{"k", "v", absl::Minutes(1)}}).ok());

  ASSERT_TRUE((*redis)->Pause().ok());
  absl::Status first;
  std::thread holder(
      [&client, &first] { first = client->GetMany({"k"}).status(); });
  absl::SleepFor(absl::Milliseconds(200));  // the holder has the connection
  std::thread resume([&redis] {
    absl::SleepFor(absl::Seconds(1));
    ASSERT_TRUE((*redis)->Resume().ok());
  });
  const SteadyTime start = SteadyClock::now();
  SetWallClockOffset("-2h");
  absl::StatusOr<std::vector<std::optional<RedisValue>>> second =
      client->GetMany({"k"});
  SetWallClockOffset("+0");
  holder.join();
  resume.join();
  EXPECT_TRUE(first.ok()) << first;
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_TRUE((*second)[0].has_value());
  EXPECT_EQ((*second)[0]->value, "v");
  EXPECT_GE(SteadySince(start), absl::Milliseconds(500));
  absl::MutexLock lock(&mu);
  EXPECT_EQ(downs, 0);
  EXPECT_EQ(ups, 1);
}

}  // namespace
}  // namespace idem
