// Writes the seed corpora of the fuzz targets: `idem_fuzz_seeds DIR` fills
// DIR/<fuzzer>/ (fuzz/make_corpus.sh runs it on fuzz/corpus). Seeds are
// small, named by what they exercise, and deterministic, so that
// regenerating them changes nothing unless this file changed.
//
// Fuzzers that read their input with FuzzedDataProvider take integers from
// the end of the input and strings from the front; SeedWriter builds such
// inputs from the values a fuzzer will consume, in the order it consumes
// them.
#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "idempotency/v1/idempotency.pb.h"
#include "server/wire/convert.h"
#include "server/cache/redis_codec.h"
#include "server/rpc/page_token.h"
#include "server/store/store.h"

namespace idem {
namespace {

std::string root;  // NOLINT: set once by main

void Write(const std::string& fuzzer, const std::string& name,
           const std::string& bytes) {
  const std::string dir = absl::StrCat(root, "/", fuzzer);
  mkdir(dir.c_str(), 0755);
  std::ofstream out(absl::StrCat(dir, "/", name), std::ios::binary);
  out << bytes;
  if (!out) {
    std::cerr << "cannot write " << dir << "/" << name << "\n";
    std::exit(1);
  }
}

// Builds an input for FuzzedDataProvider from the values it will consume.
class SeedWriter {
 public:
  // ConsumeIntegralInRange(min, max) returning `v` (for a type of
  // `type_bytes` bytes).
  SeedWriter& Int(int64_t min, int64_t max, int64_t v, int type_bytes = 8) {
    const uint64_t range =
        static_cast<uint64_t>(max) - static_cast<uint64_t>(min);
    const uint64_t x = static_cast<uint64_t>(v) - static_cast<uint64_t>(min);
    int n = 0;
    while (n < type_bytes && n < 8 && (range >> (8 * n)) > 0) ++n;
    // The first byte consumed is the most significant.
    for (int i = n - 1; i >= 0; --i) {
      tail_.push_back(static_cast<char>((x >> (8 * i)) & 0xff));
    }
    return *this;
  }
  SeedWriter& Bool(bool b) { return Int(0, 255, b ? 1 : 0, 1); }
  // ConsumeRandomLengthString(max) returning `s` (shorter than max).
  SeedWriter& Str(const std::string& s) {
    for (char c : s) {
      front_ += c;
      if (c == '\\') front_ += '\\';
    }
    front_ += "\\ ";  // a backslash and another byte end the string
    return *this;
  }
  // Bytes ConsumeRemainingBytesAsString returns (after everything else).
  SeedWriter& Rest(const std::string& s) {
    rest_ = s;
    return *this;
  }
  std::string Bytes() const {
    return front_ + rest_ + std::string(tail_.rbegin(), tail_.rend());
  }

 private:
  std::string front_;
  std::string rest_;
  std::string tail_;
};

// ---------------------------------------------------------------- validation

pb::RecordKey PbKey(const std::string& tenant, const std::string& operation,
                    const std::string& key) {
  pb::RecordKey k;
  k.set_tenant(tenant);
  k.set_operation(operation);
  k.set_key(key);
  return k;
}

google::protobuf::Duration Dur(int64_t seconds, int32_t nanos = 0) {
  google::protobuf::Duration d;
  d.set_seconds(seconds);
  d.set_nanos(nanos);
  return d;
}

pb::Snapshot PbSnapshot(int code, const std::string& body) {
  pb::Snapshot s;
  s.set_code(code);
  s.set_body(body);
  s.set_content_type("application/json");
  (*s.mutable_headers())["x-request-id"] = "r-1";
  return s;
}

void Validation(const std::string& name, int kind, bool small_limit,
                const google::protobuf::Message& m) {
  std::string bytes;
  bytes += static_cast<char>(kind);
  bytes += static_cast<char>(small_limit ? 1 : 0);
  bytes += m.SerializeAsString();
  Write("validation_fuzzer", name, bytes);
}

void ValidationSeeds() {
  const std::string hash(32, '\xab');
  pb::BeginRequest begin;
  *begin.mutable_key() = PbKey("tenant-a", "create-payment", "order-1");
  begin.set_request_hash(hash);
  Validation("begin-minimal", 0, false, begin);
  *begin.mutable_lease() = Dur(30);
  begin.set_attempt_id("attempt-1");
  *begin.mutable_wait() = Dur(2, 500000000);
  Validation("begin-full", 0, false, begin);
  pb::BeginRequest b = begin;
  b.mutable_key()->set_operation("narrow");
  *b.mutable_lease() = Dur(7);
  Validation("begin-narrow-lease", 0, false, b);
  *b.mutable_lease() = Dur(4, 999999999);
  Validation("begin-narrow-lease-short", 0, false, b);
  b = begin;
  b.mutable_key()->set_operation("wide");
  *b.mutable_lease() = Dur(0, 1000000);
  Validation("begin-wide-lease-1ms", 0, false, b);
  b = begin;
  b.mutable_key()->set_tenant("");
  Validation("begin-empty-tenant", 0, false, b);
  b = begin;
  b.mutable_key()->set_tenant("tenant a");
  Validation("begin-tenant-space", 0, false, b);
  b = begin;
  b.mutable_key()->set_operation(std::string(129, 'o'));
  Validation("begin-operation-129", 0, false, b);
  b = begin;
  b.mutable_key()->set_key(std::string(255, '~'));
  Validation("begin-key-255", 0, false, b);
  b.mutable_key()->set_key(std::string(256, '!'));
  Validation("begin-key-256", 0, false, b);
  b.mutable_key()->set_key("order 1");
  Validation("begin-key-space", 0, false, b);
  b = begin;
  b.clear_key();
  Validation("begin-no-key", 0, false, b);
  b = begin;
  b.set_request_hash(std::string(64, 'h'));
  Validation("begin-hash-64", 0, false, b);
  b.set_request_hash(std::string(65, 'h'));
  Validation("begin-hash-65", 0, false, b);
  b.set_request_hash("");
  Validation("begin-hash-empty", 0, false, b);
  b = begin;
  *b.mutable_lease() = Dur(3601);
  Validation("begin-lease-too-long", 0, false, b);
  *b.mutable_lease() = Dur(0, -5);
  Validation("begin-lease-negative-nanos", 0, false, b);
  *b.mutable_lease() = Dur(0, 999999999);
  Validation("begin-lease-under-1s", 0, false, b);
  b = begin;
  b.set_attempt_id("attempt 1");
  Validation("begin-attempt-id-space", 0, false, b);
  b = begin;
  *b.mutable_wait() = Dur(3601);
  Validation("begin-wait-too-long", 0, false, b);

  pb::HeartbeatRequest hb;
  *hb.mutable_key() = PbKey("tenant-a", "create-payment", "order-1");
  hb.set_fencing_token(3);
  Validation("heartbeat-minimal", 1, false, hb);
  *hb.mutable_extend() = Dur(60);
  Validation("heartbeat-extend", 1, false, hb);
  hb.set_fencing_token(0);
  Validation("heartbeat-token-0", 1, false, hb);

  pb::CompleteRequest complete;
  *complete.mutable_key() = PbKey("tenant-a", "create-payment", "order-1");
  complete.set_fencing_token(1);
  *complete.mutable_result() = PbSnapshot(201, "{\"id\":\"pay_1\"}");
  Validation("complete-valid", 2, false, complete);
  Validation("complete-valid-small-limit", 2, true, complete);
  pb::CompleteRequest c = complete;
  c.mutable_result()->set_body(std::string(100, 'b'));
  Validation("complete-over-small-limit", 2, true, c);
  c = complete;
  c.mutable_result()->set_content_type(std::string("text\0plain", 10));
  Validation("complete-content-type-nul", 2, false, c);
  c = complete;
  (*c.mutable_result()->mutable_headers())[""] = "v";
  Validation("complete-header-empty-name", 2, false, c);
  c = complete;
  c.mutable_result()->set_content_type(std::string(256, 'c'));
  Validation("complete-content-type-256", 2, false, c);
  c = complete;
  c.mutable_result()->set_content_type("text/plain\r\nx: 1");
  Validation("complete-content-type-crlf", 2, false, c);
  c = complete;
  (*c.mutable_result()->mutable_headers())["a b"] = "v";
  Validation("complete-header-name-not-token", 2, false, c);
  c = complete;
  (*c.mutable_result()->mutable_headers())["x"] = "a\r\nb: c";
  Validation("complete-header-value-crlf", 2, false, c);
  c = complete;
  for (int i = 0; i < 65; ++i) {
    (*c.mutable_result()->mutable_headers())["h" + std::to_string(i)] = "v";
  }
  Validation("complete-headers-65", 2, false, c);
  c = complete;
  c.clear_result();
  Validation("complete-no-result", 2, false, c);
  c = complete;
  c.set_fencing_token(-1);
  Validation("complete-token-negative", 2, false, c);

  pb::FailRequest fail;
  *fail.mutable_key() = PbKey("tenant-a", "create-payment", "order-1");
  fail.set_fencing_token(2);
  *fail.mutable_error() = PbSnapshot(503, "upstream down");
  fail.set_retryable(true);
  Validation("fail-retryable", 3, false, fail);
  fail.clear_error();
  fail.set_retryable(false);
  Validation("fail-no-error", 3, false, fail);

  pb::ResolveRequest resolve;
  *resolve.mutable_key() = PbKey("tenant-a", "create-payment", "order-1");
  resolve.set_to(pb::STATUS_SUCCEEDED);
  *resolve.mutable_result() = PbSnapshot(200, "checked by hand");
  resolve.set_reason("ledger shows the charge");
  resolve.set_actor("alice");
  resolve.set_expected_fencing_token(4);
  Validation("resolve-succeeded", 4, false, resolve);
  pb::ResolveRequest r = resolve;
  r.set_to(pb::STATUS_FAILED);
  r.clear_result();
  r.set_retryable(true);
  r.set_force(true);
  Validation("resolve-failed-retryable", 4, false, r);
  r = resolve;
  r.set_reason("");
  Validation("resolve-no-reason", 4, false, r);
  r = resolve;
  r.set_to(pb::STATUS_PROCESSING);
  Validation("resolve-to-processing", 4, false, r);
  r = resolve;
  r.clear_result();
  Validation("resolve-succeeded-no-result", 4, false, r);
  r = resolve;
  r.set_actor(std::string(129, 'a'));
  Validation("resolve-actor-129", 4, false, r);
  r = resolve;
  r.set_expected_fencing_token(-1);
  Validation("resolve-expected-negative", 4, false, r);

  pb::ListRequest list;
  Validation("list-empty", 5, false, list);
  list.set_tenant("tenant-a");
  list.set_operation("create-payment");
  list.set_status(pb::STATUS_UNKNOWN);
  *list.mutable_older_than() = Dur(600);
  list.set_page_size(50);
  Validation("list-filters", 5, false, list);
  ListQuery q;
  q.tenant = "tenant-a";
  q.operation = "create-payment";
  q.status = Status::kUnknown;
  q.older_than = absl::Seconds(600);
  ListCursor cursor{absl::FromUnixMicros(1700000000123456),
                    RecordKey{"tenant-a", "create-payment", "order|9"}};
  list.set_page_token(EncodePageToken(q, cursor));
  Validation("list-page-token", 5, false, list);
  pb::ListRequest l = list;
  l.set_page_token("not-a-token");
  Validation("list-bad-page-token", 5, false, l);
  l = list;
  l.set_page_size(5000);
  l.clear_page_token();
  Validation("list-page-size-capped", 5, false, l);
  l.set_page_size(-1);
  Validation("list-page-size-negative", 5, false, l);
  l = list;
  l.set_status(static_cast<pb::Status>(9));
  l.clear_page_token();
  Validation("list-status-unknown-value", 5, false, l);

  pb::HistoryRequest history;
  *history.mutable_key() = PbKey("tenant-a", "create-payment", "order-1");
  Validation("history-valid", 6, false, history);
  history.set_page_size(5000);
  history.set_page_token(EncodeHistoryToken(
      RecordKey{"tenant-a", "create-payment", "order-1"}, 42));
  Validation("history-page-2", 6, false, history);
  history.set_page_token(EncodeHistoryToken(
      RecordKey{"tenant-a", "create-payment", "order-2"}, 42));
  Validation("history-token-of-another-key", 6, false, history);
  history.clear_page_token();
  history.set_page_size(-1);
  Validation("history-page-size-negative", 6, false, history);

  pb::GetRequest get;
  *get.mutable_key() = PbKey("tenant-a", "create-payment", "order-1");
  Validation("get-valid", 7, false, get);
  get.mutable_key()->set_key(std::string("k\x7f", 2));
  Validation("get-key-del", 7, false, get);
}

// -------------------------------------------------------------- statemachine

// Mirrors statemachine_fuzzer.cc's consumption.
class Scenario {
 public:
  Scenario(bool release, int retention_s, int tombstone_s) {
    w_.Bool(release).Int(1, 1000, retention_s, 4).Bool(tombstone_s == 0);
    if (tombstone_s != 0) w_.Int(1, 1000, tombstone_s, 4);
  }
  // hash: 0 the record's, 1 another; attempt: 0 "", 1 "a", 2 "b", 3 "c".
  Scenario& Begin(int hash, int attempt, int lease_ms) {
    w_.Int(0, 11, 0, 4);
    Decide(0, hash, attempt, lease_ms);
    return *this;
  }
  // token: 0 current, 2 current-1, 3 current+1.
  Scenario& Heartbeat(int token, int extend_ms) {
    w_.Int(0, 11, 2, 4).Int(0, 4, token, 4).Int(1, 120000, extend_ms, 4);
    return *this;
  }
  // snapshot: 0 ok, 1 created, 2 error.
  Scenario& Complete(int token, int snapshot) {
    w_.Int(0, 11, 3, 4).Int(0, 4, token, 4).Int(0, 3, snapshot, 4);
    return *this;
  }
  Scenario& Fail(int token, int snapshot, bool retryable) {
    w_.Int(0, 11, 4, 4).Int(0, 4, token, 4).Int(0, 3, snapshot, 4);
    w_.Bool(retryable);
    return *this;
  }
  Scenario& Get() {
    w_.Int(0, 11, 5, 4);
    return *this;
  }
  // to: 0 SUCCEEDED, 1 FAILED; reason: 0 none, 1 "fixed".
  Scenario& Resolve(int to, bool with_result, bool retryable, int reason,
                    bool force) {
    w_.Int(0, 11, 6, 4).Int(0, 3, to, 4).Int(0, 3, with_result ? 1 : 0, 4);
    if (with_result) w_.Int(0, 3, 0, 4);
    w_.Bool(retryable).Int(0, 2, reason, 4).Int(0, 2, 1, 4);
    w_.Bool(true).Bool(force);  // no expected token
    return *this;
  }
  Scenario& Advance(int ms) {
    w_.Int(0, 11, 7, 4).Int(0, 200000, ms, 4);
    return *this;
  }
  Scenario& Reap() {
    w_.Int(0, 11, 8, 4);
    return *this;
  }
  Scenario& Purge() {
    w_.Int(0, 11, 9, 4);
    return *this;
  }
  Scenario& Read() {
    w_.Int(0, 11, 10, 4);
    return *this;
  }
  // A Begin decided on the last Read().
  Scenario& RacedBegin(int hash, int attempt, int lease_ms) {
    w_.Int(0, 11, 11, 4).Int(0, 6, 0, 4);
    Decide(0, hash, attempt, lease_ms);
    return *this;
  }
  Scenario& RacedComplete(int token, int snapshot) {
    w_.Int(0, 11, 11, 4).Int(0, 6, 2, 4).Int(0, 4, token, 4);
    w_.Int(0, 3, snapshot, 4);
    return *this;
  }
  std::string Bytes() const { return w_.Bytes(); }

 private:
  void Decide(int, int hash, int attempt, int lease_ms) {
    w_.Int(0, 7, hash == 0 ? 1 : 0, 4).Int(1, 120000, lease_ms, 4);
    w_.Int(0, 3, attempt, 4);
  }
  SeedWriter w_;
};

void StatemachineSeeds() {
  auto put = [](const std::string& name, const Scenario& s) {
    Write("statemachine_fuzzer", name, s.Bytes());
  };
  put("complete-then-replay", Scenario(false, 60, 30)
                                  .Begin(0, 1, 30000)
                                  .Complete(0, 0)
                                  .Begin(0, 2, 30000)
                                  .Complete(0, 0)
                                  .Begin(1, 0, 30000));
  put("lease-runs-out-unknown-then-resolve",
      Scenario(false, 60, 30)
          .Begin(0, 1, 1000)
          .Advance(2000)
          .Begin(0, 2, 1000)
          .Begin(0, 2, 1000)
          .Resolve(1, false, true, 1, false)
          .Begin(0, 3, 1000)
          .Complete(0, 0)
          .Complete(2, 1));
  put("lease-runs-out-release", Scenario(true, 60, 0)
                                    .Begin(0, 1, 1000)
                                    .Advance(1500)
                                    .Begin(0, 2, 5000)
                                    .Complete(2, 0)
                                    .Complete(0, 1));
  put("reaper-then-late-report", Scenario(false, 60, 30)
                                     .Begin(0, 1, 1000)
                                     .Advance(1000)
                                     .Reap()
                                     .Get()
                                     .Complete(0, 0)
                                     .Begin(0, 0, 1000));
  put("retryable-fail-reacquire", Scenario(false, 60, 30)
                                      .Begin(0, 1, 5000)
                                      .Fail(0, 2, true)
                                      .Begin(0, 2, 5000)
                                      .Heartbeat(0, 9000)
                                      .Heartbeat(2, 9000)
                                      .Fail(0, 2, false)
                                      .Begin(0, 3, 5000));
  put("same-attempt-regains", Scenario(false, 60, 30)
                                  .Begin(0, 1, 5000)
                                  .Begin(0, 1, 5000)
                                  .Begin(0, 2, 5000)
                                  .Begin(0, 0, 5000)
                                  .Advance(6000)
                                  .Begin(0, 1, 5000));
  put("purge-to-tombstone", Scenario(false, 1, 2)
                                .Begin(0, 1, 5000)
                                .Complete(0, 0)
                                .Advance(1500)
                                .Purge()
                                .Begin(0, 1, 5000)
                                .Get()
                                .Advance(3000)
                                .Purge()
                                .Begin(0, 1, 5000));
  put("raced-begins", Scenario(true, 60, 30)
                          .Read()
                          .Begin(0, 1, 1000)
                          .RacedBegin(0, 2, 1000)
                          .Advance(2000)
                          .Read()
                          .Begin(0, 3, 1000)
                          .RacedBegin(0, 2, 1000)
                          .RacedComplete(0, 0));
  put("stale-complete-after-reacquire", Scenario(true, 60, 30)
                                            .Begin(0, 1, 1000)
                                            .Read()
                                            .Advance(1000)
                                            .Begin(0, 2, 1000)
                                            .RacedComplete(0, 1)
                                            .Complete(0, 0));
  put("force-resolve-processing", Scenario(false, 60, 30)
                                      .Begin(0, 1, 60000)
                                      .Resolve(0, true, false, 1, false)
                                      .Resolve(0, true, false, 1, true)
                                      .Resolve(0, true, false, 1, true)
                                      .Complete(0, 0)
                                      .Resolve(1, false, false, 0, false));
  // Random inputs of assorted lengths.
  std::mt19937 rng(8);
  for (int i = 0; i < 20; ++i) {
    std::string bytes(16 + 24 * i, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    Write("statemachine_fuzzer", absl::StrCat("random-", i), bytes);
  }
}

// ---------------------------------------------------------------- page token

// Mirrors page_token_fuzzer.cc's Query().
void WriteQuery(SeedWriter& w, const ListQuery& q) {
  auto name = [&w](const std::string& s) {
    w.Int(0, 12, static_cast<int64_t>(s.size()));
    static constexpr char kChars[] = "ABCXYZabcxyz0189._:-";
    for (char c : s) {
      const char* at =
          std::char_traits<char>::find(kChars, sizeof(kChars) - 1, c);
      w.Int(0, sizeof(kChars) - 2, at == nullptr ? 0 : at - kChars);
    }
  };
  name(q.tenant);
  name(q.operation);
  w.Int(0, 4, q.status ? static_cast<int>(*q.status) + 1 : 0, 4);
  w.Int(0, int64_t{10} * 366 * 86400 * 1000000,
        absl::ToInt64Microseconds(q.older_than));
  w.Int(1, 1000, q.limit, 4);
}

void PageTokenSeeds() {
  ListQuery all;
  ListQuery filtered;
  filtered.tenant = "abc";
  filtered.operation = "xyz.0:1-";
  filtered.status = Status::kUnknown;
  filtered.older_than = absl::Minutes(10);
  filtered.limit = 100;
  const ListCursor cursor{absl::FromUnixMicros(1700000000123456),
                          RecordKey{"abc", "xyz", "order-1"}};
  int i = 0;
  for (const ListQuery* q : {&all, &filtered}) {
    SeedWriter valid;
    WriteQuery(valid, *q);
    valid.Bool(true).Rest(EncodePageToken(*q, cursor));
    Write("page_token_fuzzer", absl::StrCat("decode-valid-", i), valid.Bytes());
    SeedWriter other;
    WriteQuery(other, *q);
    other.Bool(true).Rest(EncodePageToken(q == &all ? filtered : all, cursor));
    Write("page_token_fuzzer", absl::StrCat("decode-other-filters-", i),
          other.Bytes());
    SeedWriter garbage;
    WriteQuery(garbage, *q);
    garbage.Bool(true).Rest("djEKfHx8MAox");
    Write("page_token_fuzzer", absl::StrCat("decode-garbage-", i),
          garbage.Bytes());
    ++i;
  }
  std::mt19937 rng(5);
  for (int j = 0; j < 16; ++j) {
    std::string bytes(8 + 16 * j, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    Write("page_token_fuzzer", absl::StrCat("random-", j), bytes);
  }
}

// -------------------------------------------------------------------- config

void ConfigSeeds() {
  const std::vector<std::pair<std::string, std::string>> seeds = {
      {"empty", ""},
      {"design-example",
       "defaults:   {lease: 30s, min_lease: 1s, max_lease: 1h, retention: 24h, "
       "on_lease_expiry: unknown}\n"
       "operations:\n"
       "  create-payment: {retention: 72h, on_lease_expiry: unknown}\n"
       "  send-email:     {lease: 5m, on_lease_expiry: release}\n"},
      {"block-style",
       "defaults:\n  lease: 10s\n  retention: 1h\n"
       "operations:\n  refund:\n    lease: 2m\n    max_lease: 10m\n"
       "    tombstone_retention: 0s\n"},
      {"probe",
       "operations:\n  charge: {probe: \"payments.svc:7070\", "
       "reconcile_attempts: 3}\n"},
      {"bad-duration", "defaults: {lease: soon}\n"},
      {"bad-bounds", "defaults: {min_lease: 10s, max_lease: 5s}\n"},
      {"lease-out-of-bounds", "operations:\n  x: {lease: 2h}\n"},
      {"unknown-field", "defaults: {leese: 30s}\n"},
      {"unknown-top-level", "default: {}\n"},
      {"bad-policy", "defaults: {on_lease_expiry: forget}\n"},
      {"not-a-map", "- a\n- b\n"},
      {"operations-list", "operations: [a, b]\n"},
      {"null-operation", "operations:\n  a:\n  b: ~\n"},
      {"anchors",
       "defaults: &d {lease: 20s}\noperations:\n  a: *d\n  b: {<<: *d}\n"},
      {"flow-mapping-key", "operations: {? a : {lease: 5s}}\n"},
      {"bad-yaml", "defaults: {lease: [30s\n"},
      {"tabs", "defaults:\n\tlease: 30s\n"},
      {"zero", "defaults: {retention: 0s}\n"},
      {"negative", "defaults: {lease: -5s}\n"},
      {"fractional", "defaults: {lease: 1.5s, min_lease: 500ms}\n"},
      {"reconcile-bad", "operations:\n  a: {reconcile_attempts: 0}\n"},
      {"probe-bad", "operations:\n  a: {probe: \"no-port\"}\n"},
      {"document-markers", "---\ndefaults: {lease: 30s}\n...\n"},
      {"comments", "# policies\ndefaults: {lease: 30s} # default\n"},
      // Values of the wrong type.
      {"type-lease", "defaults: {lease: [30s]}\n"},
      {"type-defaults", "defaults: [lease]\n"},
      {"type-operations", "operations: 5\n"},
      {"type-policy", "operations:\n  a: [lease, 5s]\n"},
      {"type-expiry", "defaults: {on_lease_expiry: {a: b}}\n"},
      {"type-attempts", "operations:\n  a: {reconcile_attempts: [3]}\n"},
  };
  for (const auto& [name, text] : seeds) Write("config_fuzzer", name, text);
}

// ---------------------------------------------------------------------- auth

void AuthSeeds() {
  const std::vector<std::pair<std::string, std::string>> seeds = {
      {"empty-object", "{}"},
      {"principals",
       R"({"principals": [{"name": "payments", "token": "0123456789abcdef",
        "tenants": ["tenant-a"], "role": "service"},
       {"name": "ops", "token": "fedcba9876543210fedc", "tenants": ["*"],
        "role": "operator"}]})"},
      {"certificates",
       R"({"certificates": [{"san": "spiffe://prod/payments",
        "name": "payments", "tenants": ["tenant-a", "tenant-b"]}]})"},
      {"both",
       R"({"principals": [{"name": "a", "token": "aaaaaaaaaaaaaaaa",
        "tenants": ["t"]}], "certificates": [{"san": "dns:a", "name": "a",
        "tenants": ["t"], "role": "operator"}]})"},
      {"short-token",
       R"({"principals": [{"name": "a", "token": "short", "tenants": ["t"]}]})"},
      {"duplicate-token",
       R"({"principals": [{"name": "a", "token": "aaaaaaaaaaaaaaaa",
        "tenants": ["t"]}, {"name": "b", "token": "aaaaaaaaaaaaaaaa",
        "tenants": ["t"]}]})"},
      {"bad-role",
       R"({"principals": [{"name": "a", "token": "aaaaaaaaaaaaaaaa",
        "tenants": ["t"], "role": "admin"}]})"},
      {"no-tenants",
       R"({"principals": [{"name": "a", "token": "aaaaaaaaaaaaaaaa",
        "tenants": []}]})"},
      {"unknown-field",
       R"({"principals": [{"name": "a", "token": "aaaaaaaaaaaaaaaa",
        "tenants": ["t"], "expires": "never"}]})"},
      {"unknown-top-level", R"({"users": []})"},
      {"not-a-list", R"({"principals": {"name": "a"}})"},
      {"not-json", "principals: []"},
      {"array", "[1, 2, 3]"},
      {"nested", R"({"principals": [[[[{"name": "a"}]]]]})"},
      {"unicode",
       "{\"certificates\": [{\"san\": \"spiffe://\\u00e9t\\u00e9\", "
       "\"name\": \"\\ud83d\\ude00\", \"tenants\": [\"t\"]}]}"},
      // Every field with a value of the wrong type.
      {"type-name", R"({"principals": [{"name": 7, "token":
        "aaaaaaaaaaaaaaaa", "tenants": ["t"]}]})"},
      {"type-token", R"({"principals": [{"name": "a", "token":
        1234567890123456789, "tenants": ["t"]}]})"},
      {"type-tenants", R"({"principals": [{"name": "a", "token":
        "aaaaaaaaaaaaaaaa", "tenants": "t"}]})"},
      {"type-tenant", R"({"principals": [{"name": "a", "token":
        "aaaaaaaaaaaaaaaa", "tenants": [null]}]})"},
      {"type-role", R"({"certificates": [{"san": "dns:a", "name": "a",
        "tenants": ["t"], "role": true}]})"},
      {"type-san", R"({"certificates": [{"san": {}, "name": "a",
        "tenants": ["t"]}]})"},
      {"type-principal", R"({"principals": ["a"]})"},
      {"constant-time-equal", std::string("\0", 1) + "abcdabcd"},
      {"constant-time-prefix", std::string("\0", 1) + "abcabcd"},
  };
  for (const auto& [name, text] : seeds) Write("auth_fuzzer", name, text);
}

// --------------------------------------------------------------- redis codec

Record CachedRecord(const RecordKey& key) {
  Record r;
  r.key = key;
  r.status = Status::kSucceeded;
  r.request_hash = std::string(32, '\x11');
  r.fencing_token = 3;
  r.attempt = 3;
  r.lease_expires_at = absl::FromUnixSeconds(1700000030);
  Snapshot s;
  s.code = 201;
  s.body = "{\"id\":\"pay_1\"}";
  s.content_type = "application/json";
  s.headers["x-request-id"] = "r-1";
  r.result = s;
  r.created_at = absl::FromUnixSeconds(1700000000);
  r.updated_at = absl::FromUnixSeconds(1700000010);
  r.expires_at = absl::FromUnixSeconds(1700086410);
  return r;
}

// The bytes redis_codec_fuzzer.cc's Text() maps to `text` (printable ASCII).
std::string RawText(const std::string& text) {
  std::string raw;
  for (char c : text) raw += static_cast<char>(c - ' ');
  return raw;
}

// Mirrors redis_codec_fuzzer.cc: mode, store_now, elapsed, key.
SeedWriter RedisHeader(int mode, const RecordKey& key) {
  SeedWriter w;
  w.Int(0, 4, mode, 4)
      .Int(0, int64_t{253402300799} * 1000000, int64_t{1700000020} * 1000000)
      .Int(0, 10000, 15, 4);
  w.Str(RawText(key.tenant)).Str(RawText(key.operation)).Str(RawText(key.key));
  return w;
}

void RedisSeeds() {
  // redis_codec_fuzzer.cc's key.
  const std::shared_ptr<const CacheMac> mac =
      *CacheMac::Create(std::string(32, 'F'));
  const RecordKey key{"tenant-a", "create-payment", "order-1"};
  const Record record = CachedRecord(key);
  const std::string value = EncodeCacheValue(record, *mac);
  Write("redis_codec_fuzzer", "value-valid",
        RedisHeader(0, key).Rest(value).Bytes());
  Write("redis_codec_fuzzer", "value-other-key",
        RedisHeader(0, RecordKey{"tenant-a", "create-payment", "order-2"})
            .Rest(value)
            .Bytes());
  Write("redis_codec_fuzzer", "value-truncated",
        RedisHeader(0, key).Rest(value.substr(0, 20)).Bytes());
  Write("redis_codec_fuzzer", "value-not-envelope",
        RedisHeader(0, key).Rest("IDC0....").Bytes());
  Write("redis_codec_fuzzer", "value-other-mac-key",
        RedisHeader(0, key)
            .Rest(EncodeCacheValue(record,
                                   **CacheMac::Create(std::string(32, 'G'))))
            .Bytes());
  pb::Record p;
  ToProto(record, /*with_result=*/true, &p);
  // The previous version's envelope: a CRC-32C where the MAC goes.
  Write("redis_codec_fuzzer", "value-idc1",
        RedisHeader(0, key)
            .Rest("IDC1\x1f\x2e\x3d\x4c" + p.SerializeAsString())
            .Bytes());
  Write("redis_codec_fuzzer", "payload-valid",
        RedisHeader(1, key).Rest(p.SerializeAsString()).Bytes());
  pb::Record q = p;
  q.set_status(pb::STATUS_PROCESSING);
  Write("redis_codec_fuzzer", "payload-processing",
        RedisHeader(1, key).Rest(q.SerializeAsString()).Bytes());
  q = p;
  q.set_retryable(true);
  q.set_status(pb::STATUS_FAILED);
  Write("redis_codec_fuzzer", "payload-retryable",
        RedisHeader(1, key).Rest(q.SerializeAsString()).Bytes());
  q = p;
  q.set_fencing_token(0);
  Write("redis_codec_fuzzer", "payload-no-token",
        RedisHeader(1, key).Rest(q.SerializeAsString()).Bytes());
  q = p;
  q.clear_expires_at();
  Write("redis_codec_fuzzer", "payload-no-expiry",
        RedisHeader(1, key).Rest(q.SerializeAsString()).Bytes());
  // Another identity whose parts join alike, sealed for this one.
  q = p;
  q.mutable_key()->set_tenant("tenant-a:create-payment");
  q.mutable_key()->set_operation("order-1");
  q.mutable_key()->set_key("x");
  Write("redis_codec_fuzzer", "payload-colliding-identity",
        RedisHeader(1, RecordKey{"tenant-a", "create-payment:order-1", "x"})
            .Rest(q.SerializeAsString())
            .Bytes());
  std::mt19937 rng(13);
  for (int mode = 2; mode <= 4; ++mode) {
    for (int j = 0; j < 6; ++j) {
      std::string bytes(64 + 32 * j, '\0');
      for (char& c : bytes) c = static_cast<char>(rng());
      bytes.back() = static_cast<char>(mode);  // the mode is consumed first
      Write("redis_codec_fuzzer", absl::StrCat("random-mode", mode, "-", j),
            bytes);
    }
  }
}

// ------------------------------------------------------------------- gateway

void GatewayConfigSeeds() {
  const std::string nul("\0", 1);
  const std::string doc_example =
      "gateway:\n"
      "  scope_headers: [authorization]\n"
      "  routes:\n"
      "    - name: create-payment\n"
      "      methods: [POST]\n"
      "      path: /payments\n"
      "      key: required\n"
      "      wait: 0s\n"
      "      lease: 60s\n"
      "      timeout: 30s\n"
      "      retention: 24h\n"
      "      retry_statuses: [408, 429, 500-599]\n"
      "      fingerprint_headers: [content-type]\n"
      "      snapshot_headers:\n"
      "        allow: []\n"
      "        deny: [set-cookie]\n"
      "      max_body: 65536\n"
      "    - name: update-order\n"
      "      methods: [PATCH]\n"
      "      path: /orders/*\n"
      "      key: optional\n";
  const std::vector<std::pair<std::string, std::string>> seeds = {
      {"empty", ""},
      {"no-section", "defaults: {lease: 30s}\n"},
      {"null-section", "gateway:\n"},
      {"doc-example", doc_example},
      {"doc-example-requests",
       doc_example + nul +
           "POST /payments\nPATCH /orders/7\nPATCH /orders/7/x\n"
           "POST /payments?x=1\nPOST /payments/\nGET /payments\n"},
      {"wildcards",
       "gateway:\n  routes:\n"
       "    - {name: a, methods: [POST, put], path: /a/*/c}\n"
       "    - {name: b, methods: [PATCH], path: /b/**}\n"
       "    - {name: c, methods: [POST], path: /}\n" +
           nul + "POST /a/b/c\nPUT /a//c\nPATCH /b\nPATCH /b/x/y\nPOST /\n"},
      {"flow-style",
       "{gateway: {scope_headers: [Authorization, X-Tenant], routes: "
       "[{name: x, key: off}]}}\n"},
      {"snapshot-allow",
       "gateway:\n  routes:\n    - name: s\n      snapshot_headers: "
       "{allow: [x-a, content-type], deny: []}\n"},
      {"retention-twice",
       "gateway:\n  routes:\n    - {name: a, retention: 1h}\n"
       "    - {name: a, retention: 2h}\n"},
      {"retention-and-operations",
       "operations:\n  a: {lease: 5s}\ngateway:\n  routes:\n"
       "    - {name: a, retention: 1h}\n"},
      {"lease-out-of-bounds",
       "gateway:\n  routes:\n    - {name: a, timeout: 1h}\n"},
      {"double-star-middle",
       "gateway:\n  routes:\n    - {name: a, path: /a/**/b}\n"},
      {"path-query", "gateway:\n  routes:\n    - {name: a, path: /a?b}\n"},
      {"bad-method",
       "gateway:\n  routes:\n    - {name: a, methods: [\"P T\"]}\n"},
      {"no-methods", "gateway:\n  routes:\n    - {name: a, methods: []}\n"},
      {"bad-status",
       "gateway:\n  routes:\n    - {name: a, retry_statuses: [500-400, 99]}\n"},
      {"bad-key", "gateway:\n  routes:\n    - {name: a, key: maybe}\n"},
      {"long-wait", "gateway:\n  routes:\n    - {name: a, wait: 2h}\n"},
      {"huge-body",
       "gateway:\n  routes:\n    - {name: a, max_body: 99999999999}\n"},
      {"no-name", "gateway:\n  routes:\n    - {methods: [POST]}\n"},
      {"bad-name", "gateway:\n  routes:\n    - {name: \"a b\"}\n"},
      {"empty-routes", "gateway:\n  routes: []\n"},
      {"unknown-field", "gateway:\n  routes:\n    - {name: a, verbs: [GET]}\n"},
      {"unknown-top", "gateway:\n  upstream: x\n"},
      {"scope-not-list", "gateway:\n  scope_headers: authorization\n"},
      {"anchors",
       "gateway:\n  routes:\n    - &r {name: a, methods: [POST]}\n"
       "    - *r\n    - {<<: *r, path: /b}\n"},
      {"complex-key", "gateway:\n  routes:\n    - {? [a] : b}\n"},
  };
  for (const auto& [name, text] : seeds) {
    Write("gateway_config_fuzzer", name, text);
  }
}

void GatewayRequestSeeds() {
  const std::string payment =
      "POST /payments HTTP/1.1\r\nHost: shop\r\n"
      "Authorization: Bearer t-1\r\nX-Tenant: acme\r\n"
      "Content-Type: application/json\r\n";
  const std::string body = "{\"amount\":10}";
  auto with = [&](const std::string& fields, const std::string& b) {
    return absl::StrCat(payment, fields, "Content-Length: ", b.size(),
                        "\r\n\r\n", b);
  };
  const std::vector<std::pair<std::string, std::string>> seeds = {
      {"key-value-quoted", "\"pay-1\""},
      {"key-value-bare", "pay-1"},
      {"key-value-escapes", " \"a\\\"b\\\\c\"\t"},
      {"key-value-bad-escape", "\"a\\b\""},
      {"key-value-parameter", "\"a\";x=1"},
      {"key-value-unclosed", "\"abc"},
      {"key-value-empty", "\"\""},
      {"key-value-long", std::string(201, 'k')},
      {"key-value-space", "\"a b\""},
      {"payment", with("Idempotency-Key: \"pay-1\"\r\n", body)},
      {"payment-bare-key", with("idempotency-key: pay-1\r\n", body)},
      {"payment-escaped-key",
       with("Idempotency-Key: \"p\\\"a\\\\y\"\r\n", body)},
      {"payment-two-keys",
       with("Idempotency-Key: \"a\"\r\nIDEMPOTENCY-KEY: \"b\"\r\n", body)},
      {"payment-no-key", with("", body)},
      {"payment-long-key",
       with("Idempotency-Key: \"" + std::string(200, 'k') + "\"\r\n", body)},
      {"payment-bad-key", with("Idempotency-Key: \"a\";p=1\r\n", body)},
      {"payment-body-too-large",
       with("Idempotency-Key: \"pay-1\"\r\n", std::string(65, 'x'))},
      {"payment-class",
       with("Idempotency-Key: k\r\nX-Request-Class: a\r\n", body)},
      {"payment-chunked",
       payment + "Idempotency-Key: \"c-1\"\r\nTransfer-Encoding: chunked\r\n"
                 "\r\n5\r\n{\"amo\r\n8\r\nunt\":10}\r\n0\r\n\r\n"},
      {"payment-continue",
       with("Idempotency-Key: \"pay-1\"\r\nExpect: 100-continue\r\n", body)},
      {"pipelined", with("Idempotency-Key: \"p-1\"\r\n", body) +
                        with("Idempotency-Key: \"p-2\"\r\n", body) +
                        "GET /health HTTP/1.1\r\nHost: shop\r\n\r\n"},
      {"order-optional",
       "PATCH /orders/42?full=1 HTTP/1.1\r\nHost: shop\r\n"
       "Idempotency-Key: o-42\r\nContent-Length: 2\r\n\r\n{}"},
      {"order-no-key",
       "PUT /orders/42 HTTP/1.1\r\nHost: shop\r\nContent-Length: 2\r\n\r\n{}"},
      {"files-key-off",
       "POST /files/a/b HTTP/1.1\r\nHost: shop\r\nIdempotency-Key: f\r\n"
       "Content-Length: 3\r\n\r\nabc"},
      {"default-route",
       "POST /other HTTP/1.1\r\nHost: shop\r\nIdempotency-Key: \"d\"\r\n"
       "Content-Length: 0\r\n\r\n"},
      {"get", "GET /payments HTTP/1.1\r\nHost: shop\r\n\r\n"},
      {"http10",
       "POST /payments HTTP/1.0\r\nIdempotency-Key: \"x\"\r\n"
       "Content-Length: 1\r\n\r\nx"},
      {"absolute-form",
       "POST http://shop/payments HTTP/1.1\r\nHost: shop\r\n"
       "Idempotency-Key: \"x\"\r\nContent-Length: 0\r\n\r\n"},
      {"close",
       "POST /payments HTTP/1.1\r\nConnection: close\r\n"
       "Idempotency-Key: \"x\"\r\nContent-Length: 0\r\n\r\n"
       "POST /payments HTTP/1.1\r\n\r\n"},
      {"not-http", "hello\r\n\r\n"},
      {"trailer-key-required",
       "POST /payments HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
       "2\r\n{}\r\n0\r\nIdempotency-Key: \"t-2\"\r\n\r\n"},
      {"trailer-key-optional",
       "POST /other HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
       "2\r\n{}\r\n0\r\nIdempotency-Key: \"t-1\"\r\n"
       "Authorization: u1\r\n\r\n"},
      {"large-content-length",
       "POST /files/x HTTP/1.1\r\nContent-Length: 2000000\r\n\r\nabc"},
  };
  for (const auto& [name, text] : seeds) {
    Write("gateway_request_fuzzer", name, text);
  }
}

}  // namespace
}  // namespace idem

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: idem_fuzz_seeds DIR\n";
    return 2;
  }
  idem::root = argv[1];
  mkdir(idem::root.c_str(), 0755);
  idem::ValidationSeeds();
  idem::StatemachineSeeds();
  idem::PageTokenSeeds();
  idem::ConfigSeeds();
  idem::AuthSeeds();
  idem::RedisSeeds();
  idem::GatewayConfigSeeds();
  idem::GatewayRequestSeeds();
  return 0;
}
