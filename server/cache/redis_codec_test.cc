#include "server/cache/redis_codec.h"

#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "server/base/convert.h"
#include "server/cache/redis_client.h"

namespace idem {
namespace {

using ::google::protobuf::util::MessageDifferencer;

const absl::Time kT0 = absl::FromUnixMicros(1700000000123456);

Record Succeeded() {
  Record r;
  r.key = {"tenant-1", "create-payment", "order-42"};
  r.status = Status::kSucceeded;
  r.request_hash = std::string("\x00\xff hash", 7);
  r.fencing_token = 3;
  r.attempt = 2;
  r.attempt_id = "a-1";
  r.lease_expires_at = kT0 + absl::Seconds(30);
  Snapshot s;
  s.code = 201;
  for (int i = 0; i < 256; ++i) s.body.push_back(static_cast<char>(i));
  s.content_type = "application/octet-stream";
  s.headers = {{"location", "/payments/42"}, {"x-tag", "t"}};
  r.result = s;
  r.created_at = kT0;
  r.updated_at = kT0 + absl::Seconds(1);
  r.expires_at = kT0 + absl::Hours(24);
  return r;
}

pb::Record Proto(const Record& r) {
  pb::Record p;
  ToProto(r, /*with_result=*/true, &p);
  return p;
}

TEST(CacheKeyTest, IsAHashTagOfTheLengthPrefixedIdentity) {
  EXPECT_EQ(CacheKey({"t", "create-payment", "k:1"}),
            "idem:{1:t14:create-payment3:k:1}");
  EXPECT_EQ(CacheKey({"", "", ""}), "idem:{0:0:0:}");
}

TEST(CacheKeyTest, IdentitiesThatJoinAlikeGetDistinctKeys) {
  EXPECT_NE(CacheKey({"a:b", "c", "k"}), CacheKey({"a", "b:c", "k"}));
  EXPECT_NE(CacheKey({"a", "b", "c:d"}), CacheKey({"a", "b:c", "d"}));
  EXPECT_NE(CacheKey({"1:a", "b", "k"}), CacheKey({"1", "a1:b", "k"}));
}

TEST(Crc32cTest, MatchesKnownVectors) {
  EXPECT_EQ(Crc32c(""), 0u);
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  // RFC 3720, B.4.
  EXPECT_EQ(Crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(std::string(32, '\xff')), 0x62A8AB43u);
}

// Bit by bit, as the polynomial defines it.
uint32_t ReferenceCrc32c(absl::string_view data) {
  uint32_t c = 0xFFFFFFFFu;
  for (char ch : data) {
    c ^= static_cast<unsigned char>(ch);
    for (int bit = 0; bit < 8; ++bit) {
      c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    }
  }
  return c ^ 0xFFFFFFFFu;
}

TEST(Crc32cTest, MatchesTheDefinitionAtEveryLengthAndAlignment) {
  std::string bytes;
  uint32_t x = 12345;
  for (int i = 0; i < 300; ++i) {
    x = x * 1103515245u + 12345u;
    bytes.push_back(static_cast<char>(x >> 16));
  }
  const absl::string_view all(bytes);
  for (size_t offset = 0; offset < 8; ++offset) {
    for (size_t length = 0; length + offset <= all.size(); ++length) {
      const absl::string_view data = all.substr(offset, length);
      ASSERT_EQ(Crc32c(data), ReferenceCrc32c(data))
          << "offset " << offset << " length " << length;
    }
  }
}

TEST(CacheableTest, OnlyRecordsThatNeverChangeAgain) {
  Record r = Succeeded();
  EXPECT_TRUE(Cacheable(r));
  r.status = Status::kFailed;
  r.retryable = false;
  EXPECT_TRUE(Cacheable(r));
  r.retryable = true;
  EXPECT_FALSE(Cacheable(r));
  r.retryable = false;
  r.status = Status::kProcessing;
  EXPECT_FALSE(Cacheable(r));
  r.status = Status::kUnknown;
  EXPECT_FALSE(Cacheable(r));
  r = Succeeded();
  r.expires_at.reset();
  EXPECT_FALSE(Cacheable(r));
  // A tombstone has no result: Begin must see it in the store.
  r = Succeeded();
  r.tombstone = true;
  r.result.reset();
  EXPECT_FALSE(Cacheable(r));
}

TEST(CacheValueTest, RoundTripsToTheSameApiRecord) {
  const Record r = Succeeded();
  const std::string value = EncodeCacheValue(r);
  EXPECT_EQ(value.substr(0, 4), "IDC1");
  absl::StatusOr<Record> back = DecodeCacheValue(r.key, value);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(MessageDifferencer::Equals(Proto(*back), Proto(r)));
  EXPECT_EQ(back->result->body, r.result->body);
  EXPECT_EQ(back->fencing_token, 3);
  EXPECT_EQ(back->attempt_id, "");  // Not cached.
}

TEST(CacheValueTest, RoundTripsAFailedRecord) {
  Record r = Succeeded();
  r.status = Status::kFailed;
  r.result->code = 409;
  r.resolved_by = "alice";
  r.resolve_reason = "refunded by hand";
  absl::StatusOr<Record> back = DecodeCacheValue(r.key, EncodeCacheValue(r));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(MessageDifferencer::Equals(Proto(*back), Proto(r)));
}

TEST(CacheValueTest, EveryFlippedByteIsDetected) {
  const Record r = Succeeded();
  const std::string value = EncodeCacheValue(r);
  for (size_t i = 0; i < value.size(); ++i) {
    std::string bad = value;
    bad[i] = static_cast<char>(bad[i] ^ 0x20);
    absl::StatusOr<Record> back = DecodeCacheValue(r.key, bad);
    EXPECT_EQ(back.status().code(), absl::StatusCode::kDataLoss) << i;
  }
}

TEST(CacheValueTest, TruncatedOrForeignValuesAreCorrupt) {
  const Record r = Succeeded();
  const std::string value = EncodeCacheValue(r);
  for (const std::string& bad :
       {std::string(), std::string("garbage"), std::string("IDC1"),
        value.substr(0, value.size() - 1), value + "x",
        std::string("IDC2") + value.substr(4)}) {
    EXPECT_EQ(DecodeCacheValue(r.key, bad).status().code(),
              absl::StatusCode::kDataLoss)
        << bad.size();
  }
}

TEST(CacheValueTest, AnotherRecordsValueIsCorrupt) {
  Record other = Succeeded();
  other.key.key = "order-43";
  EXPECT_EQ(DecodeCacheValue(Succeeded().key, EncodeCacheValue(other))
                .status()
                .code(),
            absl::StatusCode::kDataLoss);
  // Identities whose parts join alike have keys of their own; copied under
  // the other's key, the identity inside the value tells them apart.
  Record a = Succeeded();
  a.key = {"a:b", "c", "k"};
  Record b = Succeeded();
  b.key = {"a", "b:c", "k"};
  EXPECT_NE(CacheKey(a.key), CacheKey(b.key));
  EXPECT_FALSE(DecodeCacheValue(a.key, EncodeCacheValue(b)).ok());
  EXPECT_TRUE(DecodeCacheValue(b.key, EncodeCacheValue(b)).ok());
}

TEST(CacheValueTest, RecordsThatMayChangeAreRejected) {
  Record r = Succeeded();
  r.status = Status::kFailed;
  r.retryable = true;
  EXPECT_FALSE(DecodeCacheValue(r.key, EncodeCacheValue(r)).ok());
  r = Succeeded();
  r.status = Status::kUnknown;
  EXPECT_FALSE(DecodeCacheValue(r.key, EncodeCacheValue(r)).ok());
  r = Succeeded();
  r.fencing_token = 0;
  EXPECT_FALSE(DecodeCacheValue(r.key, EncodeCacheValue(r)).ok());
}

TEST(CacheTtlTest, EndsNoLaterThanExpiresAt) {
  const Record r = Succeeded();
  const absl::Time now = *r.expires_at - absl::Minutes(10);
  EXPECT_EQ(CacheTtl(r, now, absl::ZeroDuration()), absl::Minutes(10));
  // Time spent since before the store call is taken off, rounded down.
  EXPECT_EQ(CacheTtl(r, now, absl::Microseconds(1500)),
            absl::Minutes(10) - absl::Milliseconds(2));
  EXPECT_EQ(CacheTtl(r, *r.expires_at - absl::Microseconds(999),
                     absl::ZeroDuration()),
            std::nullopt);
  EXPECT_EQ(CacheTtl(r, *r.expires_at + absl::Seconds(1), absl::ZeroDuration()),
            std::nullopt);
  Record retryable = r;
  retryable.status = Status::kFailed;
  retryable.retryable = true;
  EXPECT_EQ(CacheTtl(retryable, now, absl::ZeroDuration()), std::nullopt);
}

TEST(RedisAddressTest, ParsesTcpAndUnixAddresses) {
  absl::StatusOr<RedisAddress> a = ParseRedisAddress("redis.local:6380");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->host, "redis.local");
  EXPECT_EQ(a->port, 6380);
  EXPECT_EQ(a->unix_path, "");
  a = ParseRedisAddress("[::1]:6379");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->host, "::1");
  EXPECT_EQ(a->port, 6379);
  a = ParseRedisAddress("unix:/run/redis/redis.sock");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->unix_path, "/run/redis/redis.sock");
}

TEST(RedisAddressTest, RejectsBadAddresses) {
  for (const char* bad :
       {"", "redis", ":6379", "redis:", "redis:0", "redis:65536", "redis:x",
        "::1:6379", "[]:6379", "[::1:6379", "unix:", "unix:relative.sock"}) {
    EXPECT_EQ(ParseRedisAddress(bad).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

}  // namespace
}  // namespace idem
