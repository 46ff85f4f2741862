// The checker must fail: every planted violation is reported with its kind,
// and the clean history passes.
#include "tests/faults/checker.h"

#include "gtest/gtest.h"
#include "tests/faults/selftest.h"

namespace idem::faults {
namespace {

TEST(CheckerTest, CleanHistoryPasses) {
  Planted clean = CleanCase();
  Report r = Check(clean.history, clean.final_state);
  for (const Violation& v : r.violations) {
    ADD_FAILURE() << v.kind << " " << v.key << ": " << v.detail;
  }
  EXPECT_EQ(r.stats.grants, 3);
  EXPECT_EQ(r.stats.replays, 1);
  EXPECT_EQ(r.stats.cache_valid, 1);
  EXPECT_EQ(r.stats.cache_ignored, 1);
  EXPECT_EQ(r.stats.lost_acknowledged, 0);
}

TEST(CheckerTest, EveryPlantedViolationIsReported) {
  std::vector<Planted> cases = PlantedCases();
  ASSERT_GE(cases.size(), 20u);
  for (const Planted& p : cases) {
    Report r = Check(p.history, p.final_state);
    EXPECT_GT(r.Count(p.kind), 0) << p.name << ": expected " << p.kind;
  }
}

TEST(CheckerTest, LostWritesAreCounted) {
  Planted p = CleanCase();
  p.final_state.records.clear();
  p.final_state.effects.clear();
  Report r = Check(p.history, p.final_state);
  // Three grants, two Completes, one Resolve, two effects.
  EXPECT_EQ(r.stats.lost_acknowledged, 8);
  EXPECT_GT(r.Count("lost-grant"), 0);
  EXPECT_GT(r.Count("lost-complete"), 0);
  EXPECT_GT(r.Count("lost-effect"), 0);
}

TEST(CheckerTest, InfoOutcomesAreNotAcknowledgements) {
  Planted p = CleanCase();
  for (Op& op : p.history) {
    if (op.type == OpType::kComplete) op.result = Result::kInfo;
  }
  p.final_state.records.erase("create-payment/k1");
  Report r = Check(p.history, p.final_state);
  EXPECT_EQ(r.Count("lost-complete"), 0);
  EXPECT_GT(r.Count("lost-grant"), 0);  // the grant was acknowledged
}

TEST(HistoryTest, OpsRoundTripThroughTheirLine) {
  for (const Op& op : CleanCase().history) {
    absl::StatusOr<Op> back = ParseOp(FormatOp(op));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(FormatOp(*back), FormatOp(op));
  }
  EXPECT_FALSE(ParseOp("1\t2\t3").ok());
}

TEST(HistoryTest, SnapshotTagsRoundTrip) {
  pb::Snapshot s = TaggedSnapshot({"create-payment/k", 7, "w3"}, 201, 42);
  SnapshotTag tag;
  ASSERT_TRUE(ParseSnapshotTag(s, &tag));
  EXPECT_EQ(tag.key, "create-payment/k");
  EXPECT_EQ(tag.token, 7);
  EXPECT_EQ(tag.writer, "w3");
  EXPECT_EQ(s.body().size(), s.body().find('\n') + 1 + 256);
}

TEST(CacheTest, OnlyEnvelopesSignedForTheirKeyDecode) {
  const std::string mac_key(32, 'k');
  pb::Record r;
  r.mutable_key()->set_tenant("t");
  r.mutable_key()->set_operation("a:b");
  r.mutable_key()->set_key("c");
  r.set_fencing_token(1);
  const std::string redis_key = CacheKeyOf("t", "a:b/c");
  EXPECT_EQ(redis_key, "idem:{1:t3:a:b1:c}");
  const std::string value = CacheEnvelope(r, redis_key, mac_key);
  pb::Record back;
  EXPECT_TRUE(DecodeCacheEntry("t", redis_key, value, mac_key, &back));
  EXPECT_EQ(back.key().operation(), "a:b");
  std::string flipped = value;
  flipped[20] ^= 1;
  EXPECT_FALSE(DecodeCacheEntry("t", redis_key, flipped, mac_key, &back));
  EXPECT_FALSE(
      DecodeCacheEntry("t", redis_key, value, std::string(32, 'x'), &back));
  EXPECT_FALSE(DecodeCacheEntry(
      "t", CacheKeyOf("t", "a/b:c"),
      CacheEnvelope(r, CacheKeyOf("t", "a/b:c"), mac_key), mac_key, &back));
}

}  // namespace
}  // namespace idem::faults
