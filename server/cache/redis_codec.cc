#include "server/cache/redis_codec.h"

#include <google/protobuf/arena.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>

#include <cstddef>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/wire/convert.h"
#include "server/wire/proto_arena.h"

namespace idem {
namespace {

constexpr char kMagic[] = "IDC2";
constexpr size_t kMagicSize = 4;
constexpr size_t kHeaderSize = kMagicSize + CacheMac::kIdSize + CacheMac::kSize;

struct MacCtxFree {
  void operator()(EVP_MAC_CTX* c) const { EVP_MAC_CTX_free(c); }
};
using MacCtxPtr = std::unique_ptr<EVP_MAC_CTX, MacCtxFree>;
struct MacFree {
  void operator()(EVP_MAC* m) const { EVP_MAC_free(m); }
};

// The first kIdSize bytes of SHA-256 of `key`; empty if OpenSSL failed.
std::string KeyId(absl::string_view key) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  if (EVP_Digest(key.data(), key.size(), digest, &size, EVP_sha256(),
                 nullptr) != 1 ||
      size < CacheMac::kIdSize) {
    return "";
  }
  return std::string(reinterpret_cast<const char*>(digest), CacheMac::kIdSize);
}

// An HMAC-SHA256 context keyed with `key`, ready for updates.
MacCtxPtr NewMacCtx(absl::string_view key) {
  const std::unique_ptr<EVP_MAC, MacFree> hmac(
      EVP_MAC_fetch(nullptr, "HMAC", nullptr));
  if (hmac == nullptr) return nullptr;
  MacCtxPtr ctx(EVP_MAC_CTX_new(hmac.get()));
  if (ctx == nullptr) return nullptr;
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {
      OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
      OSSL_PARAM_construct_end()};
  if (EVP_MAC_init(ctx.get(),
                   reinterpret_cast<const unsigned char*>(key.data()),
                   key.size(), params) != 1) {
    return nullptr;
  }
  return ctx;
}

// The Redis key `key` is cached under, with its length in front: the MAC
// input cannot be split another way.
std::string BoundKey(const RecordKey& key) {
  const std::string k = CacheKey(key);
  return absl::StrCat(k.size(), ":", k);
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

struct CacheMac::Key {
  std::string id;
  MacCtxPtr ctx;  // keyed; copied for each MAC
};

CacheMac::CacheMac(std::vector<std::unique_ptr<Key>> keys)
    : keys_(std::move(keys)) {}

CacheMac::~CacheMac() = default;

absl::StatusOr<std::shared_ptr<const CacheMac>> CacheMac::Create(
    absl::string_view current, absl::string_view previous) {
  std::vector<std::unique_ptr<Key>> keys;
  for (absl::string_view k : {current, previous}) {
    if (k.empty() && !keys.empty()) break;
    if (k.size() < kMinKeySize) {
      return absl::InvalidArgumentError(
          absl::StrCat("a Redis MAC key needs at least ", kMinKeySize,
                       " bytes, got ", k.size()));
    }
    auto key = std::make_unique<Key>();
    key->id = KeyId(k);
    key->ctx = NewMacCtx(k);
    if (key->id.empty() || key->ctx == nullptr) {
      return absl::InternalError("OpenSSL: cannot set up HMAC-SHA256");
    }
    if (!keys.empty() && keys[0]->id == key->id) {
      return absl::InvalidArgumentError(
          "the previous Redis MAC key is the current one");
    }
    keys.push_back(std::move(key));
  }
  return std::make_shared<const CacheMac>(std::move(keys));
}

const std::string& CacheMac::current_id() const { return keys_[0]->id; }

bool CacheMac::Has(absl::string_view id) const {
  for (const auto& k : keys_) {
    if (k->id == id) return true;
  }
  return false;
}

std::string CacheMac::Sign(absl::string_view id,
                           const std::vector<absl::string_view>& parts) const {
  for (const auto& k : keys_) {
    if (k->id != id) continue;
    // Empty on an OpenSSL failure: such a MAC never verifies.
    const MacCtxPtr ctx(EVP_MAC_CTX_dup(k->ctx.get()));
    if (ctx == nullptr) return "";
    for (absl::string_view part : parts) {
      if (EVP_MAC_update(ctx.get(),
                         reinterpret_cast<const unsigned char*>(part.data()),
                         part.size()) != 1) {
        return "";
      }
    }
    std::string out(kSize, '\0');
    size_t size = 0;
    if (EVP_MAC_final(ctx.get(), reinterpret_cast<unsigned char*>(out.data()),
                      &size, out.size()) != 1 ||
        size != kSize) {
      return "";
    }
    return out;
  }
  return "";
}

bool Cacheable(const Record& record) {
  const bool terminal = record.status == Status::kSucceeded ||
                        (record.status == Status::kFailed && !record.retryable);
  // A tombstone has no result to replay; Begin must read it from the store
  // and answer EXPIRED.
  return terminal && record.expires_at.has_value() && !record.tombstone &&
         record.result.has_value();
}

std::string EncodeCacheValue(const Record& record, const CacheMac& mac) {
  pb::Record p;
  ToProto(record, /*with_result=*/true, &p);
  return SealCacheValue(record.key, p.SerializeAsString(), mac);
}

std::string SealCacheValue(const RecordKey& key, absl::string_view payload,
                           const CacheMac& mac) {
  std::string out(kMagic, kMagicSize);
  out.append(mac.current_id());
  out.append(mac.Sign(mac.current_id(), {out, BoundKey(key), payload}));
  out.append(payload.data(), payload.size());
  return out;
}

absl::StatusOr<Record> DecodeCacheValue(const RecordKey& key,
                                        absl::string_view value,
                                        const CacheMac& mac) {
  if (value.size() < kHeaderSize ||
      value.substr(0, kMagicSize) != absl::string_view(kMagic, kMagicSize)) {
    return Corrupt("not a cache envelope");
  }
  const absl::string_view id = value.substr(kMagicSize, CacheMac::kIdSize);
  if (!mac.Has(id)) {
    return absl::NotFoundError("cached value: signed by an unknown key");
  }
  const absl::string_view stored =
      value.substr(kMagicSize + CacheMac::kIdSize, CacheMac::kSize);
  const absl::string_view payload = value.substr(kHeaderSize);
  const std::string want =
      mac.Sign(id, {value.substr(0, kMagicSize + CacheMac::kIdSize),
                    BoundKey(key), payload});
  if (want.size() != stored.size() ||
      CRYPTO_memcmp(want.data(), stored.data(), want.size()) != 0) {
    return absl::UnauthenticatedError(
        "cached value: MAC mismatch (forged, damaged or another record's)");
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

const char* CacheRefusalReason(const absl::Status& refusal) {
  switch (refusal.code()) {
    case absl::StatusCode::kNotFound:
      return "unknown_key";
    case absl::StatusCode::kUnauthenticated:
      return "forged";
    default:
      return "corrupt";
  }
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
