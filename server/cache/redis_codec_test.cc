#include "server/cache/redis_codec.h"

#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "server/cache/redis_client.h"
#include "server/wire/convert.h"

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

const std::string kKey(32, 'k');
const std::string kOtherKey = "another key of at least thirty-two bytes";

const CacheMac& Mac() {
  static const auto* mac =
      new std::shared_ptr<const CacheMac>(*CacheMac::Create(kKey));
  return **mac;
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

TEST(CacheMacTest, NeedsLongEnoughDistinctKeys) {
  EXPECT_EQ(CacheMac::Create(std::string(31, 'k')).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CacheMac::Create(kKey, std::string(31, 'k')).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CacheMac::Create(kKey, kKey).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CacheMac::Create(kKey, kOtherKey).ok());
}

// The MAC is HMAC-SHA256 and the id the first four bytes of the key's
// SHA-256 (both as Python's hmac and hashlib compute them).
TEST(CacheMacTest, IsHmacSha256WithAShortKeyId) {
  const std::shared_ptr<const CacheMac> mac =
      *CacheMac::Create(std::string(32, '\x0b'));
  std::string want;
  for (unsigned char c :
       {0x19, 0x8a, 0x60, 0x7e, 0xb4, 0x4b, 0xfb, 0xc6, 0x99, 0x03, 0xa0,
        0xf1, 0xcf, 0x2b, 0xbd, 0xc5, 0xba, 0x0a, 0xa3, 0xf3, 0xd9, 0xae,
        0x3c, 0x1c, 0x7a, 0x3b, 0x16, 0x96, 0xa0, 0xb6, 0x8c, 0xf7}) {
    want.push_back(static_cast<char>(c));
  }
  EXPECT_EQ(mac->Sign(mac->current_id(), {"Hi ", "There"}), want);
  EXPECT_EQ(mac->current_id(), "\xf0\xe3\x8b\x83");
  EXPECT_TRUE(mac->Has(mac->current_id()));
  EXPECT_FALSE(mac->Has("abcd"));
  EXPECT_EQ(mac->Sign("abcd", {"x"}), "");
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
  const std::string value = EncodeCacheValue(r, Mac());
  EXPECT_EQ(value.substr(0, 4), "IDC2");
  EXPECT_EQ(value.substr(4, 4), Mac().current_id());
  absl::StatusOr<Record> back = DecodeCacheValue(r.key, value, Mac());
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
  absl::StatusOr<Record> back =
      DecodeCacheValue(r.key, EncodeCacheValue(r, Mac()), Mac());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(MessageDifferencer::Equals(Proto(*back), Proto(r)));
}

// The magic is checked first, then the key id, then the MAC over the rest.
TEST(CacheValueTest, EveryFlippedByteIsRefused) {
  const Record r = Succeeded();
  const std::string value = EncodeCacheValue(r, Mac());
  for (size_t i = 0; i < value.size(); ++i) {
    std::string bad = value;
    bad[i] = static_cast<char>(bad[i] ^ 0x20);
    absl::StatusOr<Record> back = DecodeCacheValue(r.key, bad, Mac());
    EXPECT_EQ(back.status().code(), i < 4 ? absl::StatusCode::kDataLoss
                                    : i < 8
                                        ? absl::StatusCode::kNotFound
                                        : absl::StatusCode::kUnauthenticated)
        << i;
  }
}

TEST(CacheValueTest, TruncatedExtendedOrOldValuesAreRefused) {
  const Record r = Succeeded();
  const std::string value = EncodeCacheValue(r, Mac());
  // An "IDC1" value of the previous version: a CRC-32C, no MAC.
  const std::string old =
      std::string("IDC1\0\0\0\0", 8) + Proto(r).SerializeAsString();
  for (const std::string& bad :
       {std::string(), std::string("garbage"), std::string("IDC2"),
        value.substr(0, 39), old, std::string("IDC1") + value.substr(4)}) {
    EXPECT_EQ(DecodeCacheValue(r.key, bad, Mac()).status().code(),
              absl::StatusCode::kDataLoss)
        << bad.size();
  }
  for (const std::string& bad :
       {value.substr(0, value.size() - 1), value + "x", value.substr(0, 40)}) {
    EXPECT_EQ(DecodeCacheValue(r.key, bad, Mac()).status().code(),
              absl::StatusCode::kUnauthenticated)
        << bad.size();
  }
}

TEST(CacheValueTest, ValuesSignedWithAnotherKeyAreRefused) {
  const Record r = Succeeded();
  const std::shared_ptr<const CacheMac> other = *CacheMac::Create(kOtherKey);
  const std::string value = EncodeCacheValue(r, *other);
  EXPECT_EQ(DecodeCacheValue(r.key, value, Mac()).status().code(),
            absl::StatusCode::kNotFound);
  // Named as signed by our key, signed by another.
  std::string forged = value;
  forged.replace(4, 4, Mac().current_id());
  EXPECT_EQ(DecodeCacheValue(r.key, forged, Mac()).status().code(),
            absl::StatusCode::kUnauthenticated);
}

// Rotation: values are signed with the current key and accepted under
// either; once the previous key is dropped, its values are refused.
TEST(CacheValueTest, RotationAcceptsThePreviousKeyUntilItIsDropped) {
  const Record r = Succeeded();
  const std::string by_old = EncodeCacheValue(r, Mac());
  const std::shared_ptr<const CacheMac> rotating =
      *CacheMac::Create(kOtherKey, kKey);
  const std::shared_ptr<const CacheMac> rotated = *CacheMac::Create(kOtherKey);
  EXPECT_TRUE(DecodeCacheValue(r.key, by_old, *rotating).ok());
  const std::string by_new = EncodeCacheValue(r, *rotating);
  EXPECT_EQ(by_new.substr(4, 4), rotated->current_id());
  EXPECT_NE(by_new.substr(4, 4), Mac().current_id());
  EXPECT_TRUE(DecodeCacheValue(r.key, by_new, *rotating).ok());
  EXPECT_TRUE(DecodeCacheValue(r.key, by_new, *rotated).ok());
  EXPECT_EQ(DecodeCacheValue(r.key, by_old, *rotated).status().code(),
            absl::StatusCode::kNotFound);
  // An instance not yet rotated does not know the new key.
  EXPECT_EQ(DecodeCacheValue(r.key, by_new, Mac()).status().code(),
            absl::StatusCode::kNotFound);
}

// The MAC covers the Redis key: another record's intact value copied under
// this key fails it before its identity is even read.
TEST(CacheValueTest, AnotherRecordsValueIsRefused) {
  Record other = Succeeded();
  other.key.key = "order-43";
  EXPECT_EQ(
      DecodeCacheValue(Succeeded().key, EncodeCacheValue(other, Mac()), Mac())
          .status()
          .code(),
      absl::StatusCode::kUnauthenticated);
  Record a = Succeeded();
  a.key = {"a:b", "c", "k"};
  Record b = Succeeded();
  b.key = {"a", "b:c", "k"};
  EXPECT_NE(CacheKey(a.key), CacheKey(b.key));
  EXPECT_EQ(DecodeCacheValue(a.key, EncodeCacheValue(b, Mac()), Mac())
                .status()
                .code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(DecodeCacheValue(b.key, EncodeCacheValue(b, Mac()), Mac()).ok());
}

TEST(CacheValueTest, RecordsThatMayChangeAreRejected) {
  Record r = Succeeded();
  r.status = Status::kFailed;
  r.retryable = true;
  EXPECT_EQ(DecodeCacheValue(r.key, EncodeCacheValue(r, Mac()), Mac())
                .status()
                .code(),
            absl::StatusCode::kDataLoss);
  r = Succeeded();
  r.status = Status::kUnknown;
  EXPECT_FALSE(DecodeCacheValue(r.key, EncodeCacheValue(r, Mac()), Mac()).ok());
  r = Succeeded();
  r.fencing_token = 0;
  EXPECT_FALSE(DecodeCacheValue(r.key, EncodeCacheValue(r, Mac()), Mac()).ok());
}

TEST(CacheValueTest, RefusalsHaveAFallbackReason) {
  const Record r = Succeeded();
  const std::string value = EncodeCacheValue(r, Mac());
  EXPECT_STREQ(
      CacheRefusalReason(DecodeCacheValue(r.key, "IDC1....", Mac()).status()),
      "corrupt");
  EXPECT_STREQ(
      CacheRefusalReason(DecodeCacheValue(r.key, value + "x", Mac()).status()),
      "forged");
  EXPECT_STREQ(CacheRefusalReason(
                   DecodeCacheValue(r.key, value, **CacheMac::Create(kOtherKey))
                       .status()),
               "unknown_key");
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
