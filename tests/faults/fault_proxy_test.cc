// The fault proxy against a local echo server: it forwards, delays,
// black-holes, resets and cuts as asked.
#include "tests/faults/fault_proxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <list>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace idem::faults {
namespace {

sockaddr_in Loopback(int port) {
  sockaddr_in a;
  std::memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  return a;
}

// Echoes every byte back; counts what it received.
class EchoServer {
 public:
  EchoServer() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a = Loopback(0);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    listen(fd_, 16);
    socklen_t len = sizeof(a);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    acceptor_ = std::thread([this] {
      while (!stop_) {
        pollfd p{fd_, POLLIN, 0};
        if (poll(&p, 1, 50) <= 0) continue;
        int c = accept(fd_, nullptr, nullptr);
        if (c < 0) continue;
        absl::MutexLock lock(&mu_);
        threads_.emplace_back([this, c] { Echo(c); });
      }
    });
  }
  ~EchoServer() {
    stop_ = true;
    acceptor_.join();
    absl::MutexLock lock(&mu_);
    for (std::thread& t : threads_) t.join();
    close(fd_);
  }
  int port() const { return port_; }
  int64_t received() const { return received_.load(); }
  bool saw_reset() const { return saw_reset_.load(); }

 private:
  void Echo(int c) {
    char buf[4096];
    while (!stop_) {
      pollfd p{c, POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      ssize_t n = read(c, buf, sizeof(buf));
      if (n < 0 && errno == ECONNRESET) saw_reset_ = true;
      if (n <= 0) break;
      received_ += n;
      if (write(c, buf, n) != n) break;
    }
    close(c);
  }

  int fd_;
  int port_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> received_{0};
  std::atomic<bool> saw_reset_{false};
  std::thread acceptor_;
  absl::Mutex mu_;
  std::list<std::thread> threads_ ABSL_GUARDED_BY(mu_);
};

int Connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a = Loopback(port);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Reads up to `want` bytes within `timeout`; returns what came, and sets
// `error` to errno of a failed read (0 on EOF or timeout).
std::string ReadFor(int fd, size_t want, absl::Duration timeout,
                    int* error = nullptr) {
  std::string out;
  const absl::Time end = absl::Now() + timeout;
  if (error != nullptr) *error = 0;
  while (out.size() < want && absl::Now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 10) <= 0) continue;
    char buf[4096];
    ssize_t n = read(fd, buf, std::min(sizeof(buf), want - out.size()));
    if (n < 0 && error != nullptr) *error = errno;
    if (n <= 0) break;
    out.append(buf, n);
  }
  return out;
}

TEST(FaultProxyTest, ForwardsBothWays) {
  EchoServer echo;
  auto proxy = FaultProxy::Start(echo.port());
  ASSERT_TRUE(proxy.ok()) << proxy.status();
  int fd = Connect((*proxy)->port());
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, "hello", 5), 5);
  EXPECT_EQ(ReadFor(fd, 5, absl::Seconds(2)), "hello");
  close(fd);
  EXPECT_EQ((*proxy)->stats().accepted, 1);
}

TEST(FaultProxyTest, DelaysEachChunk) {
  EchoServer echo;
  auto proxy = FaultProxy::Start(echo.port());
  ASSERT_TRUE(proxy.ok());
  (*proxy)->SetDelay(absl::Milliseconds(150));
  int fd = Connect((*proxy)->port());
  const absl::Time start = absl::Now();
  ASSERT_EQ(write(fd, "x", 1), 1);
  EXPECT_EQ(ReadFor(fd, 1, absl::Seconds(3)), "x");
  // Held once on the way up and once on the way down.
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(290));
  close(fd);
}

TEST(FaultProxyTest, BlackholeHoldsTrafficUntilLifted) {
  EchoServer echo;
  auto proxy = FaultProxy::Start(echo.port());
  ASSERT_TRUE(proxy.ok());
  int fd = Connect((*proxy)->port());
  ASSERT_EQ(write(fd, "a", 1), 1);
  ASSERT_EQ(ReadFor(fd, 1, absl::Seconds(2)), "a");
  (*proxy)->SetBlackhole(true);
  ASSERT_EQ(write(fd, "b", 1), 1);
  EXPECT_EQ(ReadFor(fd, 1, absl::Milliseconds(300)), "");
  (*proxy)->SetBlackhole(false);
  EXPECT_EQ(ReadFor(fd, 1, absl::Seconds(2)), "b");
  close(fd);
}

TEST(FaultProxyTest, ResetAllSendsRst) {
  EchoServer echo;
  auto proxy = FaultProxy::Start(echo.port());
  ASSERT_TRUE(proxy.ok());
  int fd = Connect((*proxy)->port());
  ASSERT_EQ(write(fd, "a", 1), 1);
  ASSERT_EQ(ReadFor(fd, 1, absl::Seconds(2)), "a");
  (*proxy)->ResetAll();
  int error = 0;
  EXPECT_EQ(ReadFor(fd, 1, absl::Seconds(2), &error), "");
  EXPECT_EQ(error, ECONNRESET);
  close(fd);
  // New connections still work.
  fd = Connect((*proxy)->port());
  ASSERT_EQ(write(fd, "c", 1), 1);
  EXPECT_EQ(ReadFor(fd, 1, absl::Seconds(2)), "c");
  close(fd);
  EXPECT_GE((*proxy)->stats().resets, 1);
}

TEST(FaultProxyTest, CutsAfterExactlyNBytesUpstream) {
  EchoServer echo;
  auto proxy = FaultProxy::Start(echo.port());
  ASSERT_TRUE(proxy.ok());
  int fd = Connect((*proxy)->port());
  (*proxy)->ArmCut(Direction::kUp, 10, 1);
  const std::string data(64, 'z');
  ASSERT_EQ(write(fd, data.data(), data.size()), 64);
  int error = 0;
  std::string back = ReadFor(fd, 64, absl::Seconds(2), &error);
  EXPECT_LE(back.size(), 10u);
  const absl::Time end = absl::Now() + absl::Seconds(2);
  while (echo.received() < 10 && absl::Now() < end) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(echo.received(), 10);
  EXPECT_EQ((*proxy)->stats().cuts, 1);
  close(fd);
  // The budget is spent: the next connection is not cut.
  fd = Connect((*proxy)->port());
  ASSERT_EQ(write(fd, data.data(), data.size()), 64);
  EXPECT_EQ(ReadFor(fd, 64, absl::Seconds(2)), data);
  close(fd);
}

TEST(FaultProxyTest, CutsTheReplyDirection) {
  EchoServer echo;
  auto proxy = FaultProxy::Start(echo.port());
  ASSERT_TRUE(proxy.ok());
  int fd = Connect((*proxy)->port());
  (*proxy)->ArmCut(Direction::kDown, 5, 1);
  const std::string data(32, 'q');
  ASSERT_EQ(write(fd, data.data(), data.size()), 32);
  int error = 0;
  std::string back = ReadFor(fd, 32, absl::Seconds(2), &error);
  EXPECT_EQ(back, std::string(5, 'q'));
  // The whole request reached the server; only the reply was cut.
  EXPECT_EQ(echo.received(), 32);
  close(fd);
}

TEST(FaultProxyTest, RefuseResetsNewConnections) {
  EchoServer echo;
  auto proxy = FaultProxy::Start(echo.port());
  ASSERT_TRUE(proxy.ok());
  (*proxy)->SetRefuse(true);
  // The kernel accepts and the proxy resets: mostly after connect()
  // returned, but on a loaded machine the reset can come first, and then
  // connect() fails. Either way nothing is echoed.
  int fd = Connect((*proxy)->port());
  if (fd >= 0) {
    if (write(fd, "a", 1) < 0) {
      // Already reset.
    }
    int error = 0;
    EXPECT_EQ(ReadFor(fd, 1, absl::Seconds(2), &error), "");
    close(fd);
  }
  EXPECT_EQ(echo.received(), 0);
  (*proxy)->Pass();
  fd = Connect((*proxy)->port());
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, "b", 1), 1);
  EXPECT_EQ(ReadFor(fd, 1, absl::Seconds(2)), "b");
  close(fd);
}

}  // namespace
}  // namespace idem::faults
