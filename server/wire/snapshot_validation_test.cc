#include "server/wire/snapshot_validation.h"

#include <string>

#include "gtest/gtest.h"

namespace idem {
namespace {

using ::idempotency::v1::Snapshot;

// `status` is INVALID_ARGUMENT whose message starts with "<field>: ".
void ExpectNames(const absl::Status& status, const std::string& field) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_EQ(status.message().rfind(field + ": ", 0), 0u)
      << status << " should start with " << field;
}

Snapshot WithHeader(const std::string& name, const std::string& value) {
  Snapshot s;
  (*s.mutable_headers())[name] = value;
  return s;
}

TEST(SnapshotValidationTest, ContentTypeIsBoundedAndOneLine) {
  Snapshot s;
  s.set_content_type(std::string(kMaxContentTypeBytes, 'c'));
  EXPECT_TRUE(CheckSnapshot(s, "result", 1 << 20).ok());
  s.set_content_type("text/plain; charset=utf-8");
  EXPECT_TRUE(CheckSnapshot(s, "result", 1 << 20).ok());
  for (const std::string& bad :
       {std::string(kMaxContentTypeBytes + 1, 'c'),
        std::string("text/plain\r\nSet-Cookie: a=b"), std::string("a\nb"),
        std::string("a\rb"), std::string("a\0b", 3)}) {
    s.set_content_type(bad);
    ExpectNames(CheckSnapshot(s, "result", 1 << 20), "result.content_type");
  }
}

// Header names are RFC 9110 tokens; values hold no line break or NUL.
TEST(SnapshotValidationTest, HeaderNamesAreTokensAndValuesOneLine) {
  for (const std::string& good :
       {std::string("x-request-id"), std::string("Location"),
        std::string("!#$%&'*+-.^_`|~09AZaz"),
        std::string(kMaxHeaderNameBytes, 'n')}) {
    EXPECT_TRUE(CheckSnapshot(WithHeader(good, "v"), "error", 1 << 20).ok())
        << good;
  }
  for (const std::string& bad :
       {std::string(""), std::string("a b"), std::string("a:b"),
        std::string(":status"), std::string("a\nb"), std::string("a\0b", 3),
        std::string("caf\xc3\xa9"), std::string("a\"b"), std::string("a/b"),
        std::string(kMaxHeaderNameBytes + 1, 'n')}) {
    ExpectNames(CheckSnapshot(WithHeader(bad, "v"), "error", 1 << 20),
                "error.headers");
  }
  EXPECT_TRUE(
      CheckSnapshot(WithHeader("x", std::string(kMaxHeaderValueBytes, 'v')),
                    "result", 1 << 20)
          .ok());
  EXPECT_TRUE(CheckSnapshot(WithHeader("x", "caf\xc3\xa9\t \"quoted\""),
                            "result", 1 << 20)
                  .ok());
  for (const std::string& bad :
       {std::string(kMaxHeaderValueBytes + 1, 'v'), std::string("a\r\nb: c"),
        std::string("a\rb"), std::string("a\nb"), std::string("a\0b", 3)}) {
    ExpectNames(CheckSnapshot(WithHeader("x", bad), "result", 1 << 20),
                "result.headers");
  }
}

TEST(SnapshotValidationTest, HeaderCountIsBounded) {
  Snapshot s;
  for (size_t i = 0; i < kMaxHeaders; ++i) {
    (*s.mutable_headers())["h" + std::to_string(i)] = "v";
  }
  EXPECT_TRUE(CheckSnapshot(s, "result", 1 << 20).ok());
  (*s.mutable_headers())["one-more"] = "v";
  ExpectNames(CheckSnapshot(s, "result", 1 << 20), "result.headers");
}

// The total counts body, content type, header names and values.
TEST(SnapshotValidationTest, TotalSizeIsBounded) {
  Snapshot s = WithHeader("ab", "cd");
  s.set_body("body");
  s.set_content_type("ct");
  EXPECT_TRUE(CheckSnapshot(s, "result", 10).ok());
  ExpectNames(CheckSnapshot(s, "result", 9), "result");
}

// The reconciler's audit reason keeps as much of the probe's detail as fits,
// never half a UTF-8 character; what it keeps of a NUL still refuses it.
TEST(SnapshotValidationTest, ProbeReasonFitsTheReasonBound) {
  EXPECT_EQ(ProbeReason("applied", ""), "reconciler: probe said applied");
  EXPECT_EQ(ProbeReason("not_applied", "no row"),
            "reconciler: probe said not_applied: no row");
  const std::string prefix = "reconciler: probe said applied: ";
  // "é" is 2 bytes: with an odd room, the last one would be cut in half.
  std::string detail;
  while (detail.size() < 2 * kMaxReasonBytes) detail += "\xc3\xa9";
  const std::string reason = ProbeReason("applied", "x" + detail);
  EXPECT_LE(reason.size(), kMaxReasonBytes);
  EXPECT_GE(reason.size(), kMaxReasonBytes - 1);
  EXPECT_EQ(reason.rfind(prefix + "x\xc3\xa9", 0), 0u);
  EXPECT_EQ(reason.back(), '\xa9');
  EXPECT_TRUE(CheckText(reason, "detail", kMaxReasonBytes, true).ok());
  const std::string nul(std::string("a\0b", 3));
  EXPECT_FALSE(
      CheckText(ProbeReason("applied", nul), "detail", kMaxReasonBytes, true)
          .ok());
  // A NUL past the cut is not stored, so it refuses nothing.
  EXPECT_TRUE(CheckText(ProbeReason("applied", std::string(2000, 'a') + nul),
                        "detail", kMaxReasonBytes, true)
                  .ok());
}

}  // namespace
}  // namespace idem
