#include "server/cache/redis_codec.h"

#include <google/protobuf/arena.h>

#include <array>
#include <cstddef>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

#include "absl/strings/str_cat.h"
#include "server/base/convert.h"
#include "server/base/proto_arena.h"

namespace idem {
namespace {

constexpr char kMagic[] = "IDC1";
constexpr size_t kMagicSize = 4;
constexpr size_t kHeaderSize = kMagicSize + 4;

// The byte-wise lookup table of the reflected Castagnoli polynomial.
const std::array<uint32_t, 256>& CrcTable() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int bit = 0; bit < 8; ++bit) {
        c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      }
      t[i] = c;
    }
    return t;
  }();
  return table;
}

#if defined(__x86_64__)
// Crc32c with SSE 4.2's crc32 instruction, 8 bytes at a time: by the table,
// a cached value's checksum was a visible share of a Redis replay's CPU.
__attribute__((target("sse4.2"))) uint32_t Crc32cBySse42(
    absl::string_view data) {
  const char* p = data.data();
  size_t n = data.size();
  uint64_t c = 0xFFFFFFFFu;
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t word;
    std::memcpy(&word, p, sizeof(word));
    c = _mm_crc32_u64(c, word);
  }
  auto c32 = static_cast<uint32_t>(c);
  for (; n > 0; ++p, --n) {
    c32 = _mm_crc32_u8(c32, static_cast<unsigned char>(*p));
  }
  return c32 ^ 0xFFFFFFFFu;
}
#endif

void PutLittleEndian32(uint32_t v, std::string* out) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}

uint32_t GetLittleEndian32(absl::string_view in) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) {
    v |= static_cast<uint32_t>(static_cast<unsigned char>(in[i])) << (8 * i);
  }
  return v;
}

absl::Status Corrupt(absl::string_view why) {
  return absl::DataLossError(absl::StrCat("cached value: ", why));
}

// The inverse of ToProto(record, /*with_result=*/true, ...).
absl::StatusOr<Record> FromProtoRecord(const pb::Record& p) {
  Record r;
  r.key = FromProto(p.key());
  if (!FromProto(p.status(), &r.status)) return Corrupt("bad status");
  r.request_hash = p.request_hash();
  r.fencing_token = p.fencing_token();
  r.attempt = p.attempt();
  r.lease_expires_at = FromProto(p.lease_expires_at());
  if (p.has_result()) r.result = FromProto(p.result());
  r.retryable = p.retryable();
  r.created_at = FromProto(p.created_at());
  r.updated_at = FromProto(p.updated_at());
  if (p.has_expires_at()) r.expires_at = FromProto(p.expires_at());
  r.resolved_by = p.resolved_by();
  r.resolve_reason = p.resolve_reason();
  return r;
}

}  // namespace

std::string CacheKey(const RecordKey& key) {
  return absl::StrCat("idem:{", key.tenant.size(), ":", key.tenant,
                      key.operation.size(), ":", key.operation, key.key.size(),
                      ":", key.key, "}");
}

uint32_t Crc32c(absl::string_view data) {
#if defined(__x86_64__)
  static const bool sse42 = __builtin_cpu_supports("sse4.2");
  if (sse42) return Crc32cBySse42(data);
#endif
  const std::array<uint32_t, 256>& table = CrcTable();
  uint32_t c = 0xFFFFFFFFu;
  for (char ch : data) {
    c = table[(c ^ static_cast<unsigned char>(ch)) & 0xFF] ^ (c >> 8);
  }
  return c ^ 0xFFFFFFFFu;
}

bool Cacheable(const Record& record) {
  const bool terminal = record.status == Status::kSucceeded ||
                        (record.status == Status::kFailed && !record.retryable);
  // A tombstone has no result to replay; Begin must read it from the store
  // and answer EXPIRED.
  return terminal && record.expires_at.has_value() && !record.tombstone &&
         record.result.has_value();
}

std::string EncodeCacheValue(const Record& record) {
  pb::Record p;
  ToProto(record, /*with_result=*/true, &p);
  const std::string payload = p.SerializeAsString();
  std::string out(kMagic, kMagicSize);
  PutLittleEndian32(Crc32c(payload), &out);
  out.append(payload);
  return out;
}

absl::StatusOr<Record> DecodeCacheValue(const RecordKey& key,
                                        absl::string_view value) {
  if (value.size() < kHeaderSize ||
      value.substr(0, kMagicSize) != absl::string_view(kMagic, kMagicSize)) {
    return Corrupt("not a cache envelope");
  }
  const absl::string_view payload = value.substr(kHeaderSize);
  if (Crc32c(payload) != GetLittleEndian32(value.substr(kMagicSize))) {
    return Corrupt("checksum mismatch");
  }
  // Parsed onto an arena whose first block is on the stack: the message is
  // copied into a Record at once, so its strings need no allocations.
  alignas(alignof(std::max_align_t)) char block[2048];
  google::protobuf::ArenaOptions options;
  options.initial_block = block;
  options.initial_block_size = sizeof(block);
  google::protobuf::Arena arena(options);
  pb::Record on_heap;
  pb::Record* p =
      kProtoArenas ? google::protobuf::Arena::CreateMessage<pb::Record>(&arena)
                   : &on_heap;
  if (!p->ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    return Corrupt("unparsable record");
  }
  absl::StatusOr<Record> r = FromProtoRecord(*p);
  if (!r.ok()) return r.status();
  if (!(r->key == key)) return Corrupt("holds another record");
  if (r->fencing_token < 1) return Corrupt("no fencing token");
  if (!Cacheable(*r)) return Corrupt("holds a record that may still change");
  return r;
}

std::optional<absl::Duration> CacheTtl(const Record& record,
                                       absl::Time store_now,
                                       absl::Duration elapsed) {
  if (!Cacheable(record)) return std::nullopt;
  const absl::Duration ttl = absl::Floor(
      *record.expires_at - store_now - elapsed, absl::Milliseconds(1));
  if (ttl < absl::Milliseconds(1)) return std::nullopt;
  return ttl;
}

}  // namespace idem
