// AppendReplay against the answer the gateway built with Boost.Beast's
// fields and serializer before it: the same bytes for every shape of
// record, version and keep-alive.
#include "server/gateway/replay.h"

#include <boost/beast/http.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "server/gateway/gateway_config.h"

namespace idem::gateway {
namespace {

namespace http = boost::beast::http;

// The replay as Connection::Answer writes it for a record AppendReplay
// refuses: the Beast response, framed and serialized by Beast.
std::string Beast(const Record& record, unsigned version, bool keep_alive) {
  http::response<http::string_body> res = ReplayResponse(record, version);
  res.keep_alive(keep_alive);
  const unsigned status = res.result_int();
  if (status < 200 || status == 204 || status == 304) res.body().clear();
  res.prepare_payload();
  std::ostringstream out;
  out << res;
  return out.str();
}

Record Recorded(Status status, int32_t code, std::string content_type,
                std::map<std::string, std::string> headers, std::string body) {
  Record r;
  r.status = status;
  Snapshot s;
  s.code = code;
  s.content_type = std::move(content_type);
  s.headers = std::move(headers);
  s.body = std::move(body);
  r.result = std::move(s);
  return r;
}

TEST(AppendReplayTest, WritesTheBytesBeastWrote) {
  std::vector<Record> records = {
      Recorded(Status::kSucceeded, 201, "application/json",
               {{"location", "/things/1"}, {"x-public", "2"}},
               R"({"id":"pay_1"})"),
      Recorded(Status::kSucceeded, 200, "", {}, ""),
      Recorded(Status::kSucceeded, 204, "text/plain", {{"etag", "\"1\""}},
               "dropped"),
      Recorded(Status::kSucceeded, 304, "", {}, "dropped"),
      Recorded(Status::kSucceeded, 0, "text/plain", {}, "grpc result"),
      Recorded(Status::kFailed, 0, "", {}, "error"),
      Recorded(Status::kFailed, 600, "", {}, "beyond HTTP"),
      Recorded(Status::kFailed, 503, "application/problem+json",
               {{"retry-after", "1"}}, "{}"),
      // A status Beast has no reason for.
      Recorded(Status::kSucceeded, 299, "", {}, "x"),
      // Fields the gateway sets itself, and hop-by-hop ones, recorded.
      Recorded(Status::kSucceeded, 201, "application/json",
               {{"connection", "x-a"},
                {"content-length", "99"},
                {"content-type", "text/html"},
                {"idempotent-replayed", "false"},
                {"keep-alive", "timeout=5"},
                {"transfer-encoding", "chunked"},
                {"x-a", "1"},
                {"z", ""}},
               std::string("\x00\xff\r\nbinary", 10)),
      // A recorded content-type field stays when the snapshot has none.
      Recorded(Status::kSucceeded, 201, "", {{"content-type", "text/html"}},
               "<p>"),
  };
  Record none;
  none.status = Status::kSucceeded;
  records.push_back(none);
  none.status = Status::kFailed;
  records.push_back(none);
  for (size_t i = 0; i < records.size(); ++i) {
    for (unsigned version : {10u, 11u}) {
      for (bool keep_alive : {false, true}) {
        std::string out = "kept";
        ASSERT_TRUE(AppendReplay(records[i], version, keep_alive, &out));
        EXPECT_EQ(out, "kept" + Beast(records[i], version, keep_alive))
            << "record " << i << ", version " << version << ", keep-alive "
            << keep_alive;
      }
    }
  }
}

TEST(AppendReplayTest, LeavesNamesNotInLowerCaseToTheCaller) {
  const Record r = Recorded(Status::kSucceeded, 201, "", {{"X-A", "1"}}, "");
  std::string out = "kept";
  EXPECT_FALSE(AppendReplay(r, 11, true, &out));
  EXPECT_EQ(out, "kept");
}

}  // namespace
}  // namespace idem::gateway
