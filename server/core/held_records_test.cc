#include "server/core/held_records.h"

#include <gtest/gtest.h>

namespace idem {
namespace {

Record Granted(const std::string& key, int64_t token) {
  Record r;
  r.key = RecordKey{"t", "op", key};
  r.fencing_token = token;
  r.attempt_id = "a" + std::to_string(token);
  return r;
}

TEST(HeldRecordsTest, FindsOnlyTheGrantedToken) {
  HeldRecords held(8);
  held.Put(Granted("k", 2));
  std::optional<Record> found = held.Find(RecordKey{"t", "op", "k"}, 2);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->attempt_id, "a2");
  EXPECT_FALSE(held.Find(RecordKey{"t", "op", "k"}, 1).has_value());
  EXPECT_FALSE(held.Find(RecordKey{"t", "op", "other"}, 2).has_value());
}

TEST(HeldRecordsTest, KeysDoNotRunIntoEachOther) {
  HeldRecords held(8);
  Record a = Granted("k", 1);
  a.key = RecordKey{"t", "op", "x"};
  Record b = Granted("k", 1);
  b.key = RecordKey{"t", "opx", ""};
  held.Put(a);
  EXPECT_FALSE(held.Find(b.key, 1).has_value());
  EXPECT_TRUE(held.Find(a.key, 1).has_value());
}

TEST(HeldRecordsTest, PutReplacesAndEraseForgets) {
  HeldRecords held(8);
  held.Put(Granted("k", 1));
  held.Put(Granted("k", 2));
  EXPECT_EQ(held.size(), 1u);
  EXPECT_FALSE(held.Find(RecordKey{"t", "op", "k"}, 1).has_value());
  EXPECT_TRUE(held.Find(RecordKey{"t", "op", "k"}, 2).has_value());
  held.Erase(RecordKey{"t", "op", "k"});
  held.Erase(RecordKey{"t", "op", "k"});
  EXPECT_EQ(held.size(), 0u);
  EXPECT_FALSE(held.Find(RecordKey{"t", "op", "k"}, 2).has_value());
}

TEST(HeldRecordsTest, ForgetsTheOldestGrantBeyondCapacity) {
  HeldRecords held(3);
  for (int i = 0; i < 3; ++i) held.Put(Granted(std::to_string(i), 1));
  // A renewed grant is the newest.
  held.Put(Granted("0", 2));
  held.Put(Granted("3", 1));
  EXPECT_EQ(held.size(), 3u);
  EXPECT_FALSE(held.Find(RecordKey{"t", "op", "1"}, 1).has_value());
  EXPECT_TRUE(held.Find(RecordKey{"t", "op", "0"}, 2).has_value());
  EXPECT_TRUE(held.Find(RecordKey{"t", "op", "2"}, 1).has_value());
  EXPECT_TRUE(held.Find(RecordKey{"t", "op", "3"}, 1).has_value());
}

TEST(HeldRecordsTest, CapacityZeroHoldsNothing) {
  HeldRecords held(0);
  held.Put(Granted("k", 1));
  EXPECT_EQ(held.size(), 0u);
  EXPECT_FALSE(held.Find(RecordKey{"t", "op", "k"}, 1).has_value());
}

}  // namespace
}  // namespace idem
