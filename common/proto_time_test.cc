#include "common/proto_time.h"

#include <gtest/gtest.h>

namespace idem {
namespace {

TEST(ProtoTimeTest, TimestampsKeepMicrosecondsAndNanosStayPositive) {
  const absl::Time t = absl::FromUnixMicros(1700000000123456);
  const google::protobuf::Timestamp ts = ToProto(t);
  EXPECT_EQ(ts.seconds(), 1700000000);
  EXPECT_EQ(ts.nanos(), 123456000);
  EXPECT_EQ(FromProto(ts), t);

  const google::protobuf::Timestamp before = ToProto(absl::FromUnixMicros(-1));
  EXPECT_EQ(before.seconds(), -1);
  EXPECT_EQ(before.nanos(), 999999000);
  EXPECT_EQ(FromProto(before), absl::FromUnixMicros(-1));
}

TEST(ProtoTimeTest, TimestampsRoundDownToMicroseconds) {
  const absl::Time t = absl::FromUnixNanos(1999);
  EXPECT_EQ(FromProto(ToProto(t)), absl::FromUnixNanos(1000));
}

TEST(ProtoTimeTest, DurationsRoundTripWithOneSign) {
  const absl::Duration d = absl::Seconds(90) + absl::Nanoseconds(5);
  const google::protobuf::Duration p = DurationToProto(d);
  EXPECT_EQ(p.seconds(), 90);
  EXPECT_EQ(p.nanos(), 5);
  EXPECT_EQ(FromProto(p), d);

  const google::protobuf::Duration negative = DurationToProto(-d);
  EXPECT_EQ(negative.seconds(), -90);
  EXPECT_EQ(negative.nanos(), -5);
  EXPECT_EQ(FromProto(negative), -d);
}

}  // namespace
}  // namespace idem
