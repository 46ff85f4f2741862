#include "server/rpc/validation.h"

#include <string>

#include "gtest/gtest.h"

namespace idem {
namespace {

google::protobuf::Duration D(int64_t seconds, int32_t nanos) {
  google::protobuf::Duration d;
  d.set_seconds(seconds);
  d.set_nanos(nanos);
  return d;
}

pb::BeginRequest Begin() {
  pb::BeginRequest req;
  req.mutable_key()->set_tenant("t");
  req.mutable_key()->set_operation("op");
  req.mutable_key()->set_key("k");
  req.set_request_hash("h");
  return req;
}

// `status` is INVALID_ARGUMENT whose message starts with "<field>: ".
void ExpectNames(const absl::Status& status, const std::string& field) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_EQ(status.message().rfind(field + ": ", 0), 0u)
      << status << " should start with " << field;
}

// google.protobuf.Duration allows nanos in [-999999999, 999999999] with the
// sign of seconds; the API's durations are not negative, so only seconds
// >= 0 with nanos 0-999999999 pass: a negative duration names the field,
// bad nanos "<field>.nanos". nanos of 2e9 once read as 2 seconds.
TEST(ValidationTest, DurationPartsFollowTheProtobufSpec) {
  const PolicySet policies;
  const struct {
    google::protobuf::Duration d;
    std::string bad;
  } cases[] = {
      {D(0, 2000000000), ".nanos"},
      {D(0, 1000000000), ".nanos"},
      {D(5, -1), ".nanos"},
      {D(0, -1), ""},
      {D(-5, 1), ""},
      {D(-1, 0), ""},
      {D(-1, -1), ""},
  };
  for (const auto& c : cases) {
    pb::BeginRequest begin = Begin();
    *begin.mutable_lease() = c.d;
    ExpectNames(ParseBegin(begin, policies).status(), "lease" + c.bad);
    begin = Begin();
    *begin.mutable_wait() = c.d;
    ExpectNames(ParseBegin(begin, policies).status(), "wait" + c.bad);
    pb::HeartbeatRequest hb;
    *hb.mutable_key() = begin.key();
    hb.set_fencing_token(1);
    *hb.mutable_extend() = c.d;
    ExpectNames(ParseHeartbeat(hb, policies).status(), "extend" + c.bad);
    pb::ListRequest list;
    *list.mutable_older_than() = c.d;
    ExpectNames(ParseList(list).status(), "older_than" + c.bad);
  }
}

TEST(ValidationTest, DurationsWithinTheirBounds) {
  const PolicySet policies;
  pb::BeginRequest begin = Begin();
  *begin.mutable_lease() = D(1, 500000000);
  *begin.mutable_wait() = D(0, 999999999);
  absl::StatusOr<BeginCommand> cmd = ParseBegin(begin, policies);
  ASSERT_TRUE(cmd.ok()) << cmd.status();
  EXPECT_EQ(cmd->lease, absl::Milliseconds(1500));
  // Out of bounds, the field itself is named.
  *begin.mutable_lease() = D(0, 999999999);
  ExpectNames(ParseBegin(begin, policies).status(), "lease");
  *begin.mutable_lease() = D(3601, 0);
  ExpectNames(ParseBegin(begin, policies).status(), "lease");
  begin = Begin();
  *begin.mutable_wait() = D(3600, 1);
  ExpectNames(ParseBegin(begin, policies).status(), "wait");
  // Unset: the policy's lease.
  cmd = ParseBegin(Begin(), policies);
  ASSERT_TRUE(cmd.ok()) << cmd.status();
  EXPECT_EQ(cmd->lease, policies.defaults().lease);
}

}  // namespace
}  // namespace idem
