#include "server/base/host_port.h"

#include <string>

#include "gtest/gtest.h"

namespace idem {
namespace {

TEST(SplitHostPortTest, SplitsHostsAndBracketedV6Literals) {
  std::string host;
  int port = -1;
  ASSERT_TRUE(SplitHostPort("127.0.0.1:8080", &host, &port));
  EXPECT_EQ(host, "127.0.0.1");
  EXPECT_EQ(port, 8080);
  ASSERT_TRUE(SplitHostPort("[::1]:0", &host, &port));
  EXPECT_EQ(host, "::1");
  EXPECT_EQ(port, 0);
  ASSERT_TRUE(SplitHostPort("localhost:65535", &host, &port));
  EXPECT_EQ(host, "localhost");
  EXPECT_EQ(port, 65535);
}

TEST(SplitHostPortTest, RefusesWhatIsNotHostColonPort) {
  std::string host;
  int port = 0;
  for (const char* bad : {"", "8080", ":8080", "[]:80", "host:", "host:http",
                          "host:-1", "host:65536", "host:80x"}) {
    EXPECT_FALSE(SplitHostPort(bad, &host, &port)) << bad;
  }
}

}  // namespace
}  // namespace idem
