#include "tests/faults/workload.h"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <pqxx/pqxx>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace idem::faults {
namespace {

// The business write: passes the per-key fence (a token at least as high as
// every token written before) and inserts the effect row, in one statement.
constexpr char kFencedInsert[] = R"(
WITH f AS (
  INSERT INTO faults_fence AS x (key, max_token) VALUES ($1, $2)
  ON CONFLICT (key) DO UPDATE SET max_token = EXCLUDED.max_token
  WHERE x.max_token <= EXCLUDED.max_token
  RETURNING 1),
ins AS (
  INSERT INTO faults_effect (key, token, writer) SELECT $1, $2, $3 FROM f
  ON CONFLICT (key, token, writer) DO NOTHING
  RETURNING 1)
SELECT (SELECT count(*) FROM f), (SELECT count(*) FROM ins))";

uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

pb::RecordKey RecordKeyOf(const std::string& key) {
  pb::RecordKey k;
  k.set_tenant(kTenant);
  size_t slash = key.find('/');
  k.set_operation(key.substr(0, slash));
  k.set_key(slash == std::string::npos ? "" : key.substr(slash + 1));
  return k;
}

Result Classify(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return Result::kOk;
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::NOT_FOUND:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::ALREADY_EXISTS:
    case grpc::StatusCode::PERMISSION_DENIED:
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::OUT_OF_RANGE:
      return Result::kFail;
    default:
      // DEADLINE_EXCEEDED, UNAVAILABLE, ABORTED, INTERNAL, UNKNOWN, ...: the
      // call may or may not have been applied.
      return Result::kInfo;
  }
}

void SleepMs(int64_t ms) { absl::SleepFor(absl::Milliseconds(ms)); }

int64_t Uniform(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

double Unit(std::mt19937_64& rng) {
  return std::uniform_real_distribution<double>(0, 1)(rng);
}

}  // namespace

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string IntentHash(const std::string& key) {
  return absl::StrCat("i", absl::Hex(Fnv1a(key), absl::kZeroPad16));
}

std::string OtherHash(const std::string& key) {
  return absl::StrCat("o", absl::Hex(Fnv1a("other:" + key), absl::kZeroPad16));
}

void Recorder::Add(Op op) {
  absl::MutexLock lock(&mu_);
  ops_.push_back(std::move(op));
}

std::vector<Op> Recorder::Take() {
  absl::MutexLock lock(&mu_);
  std::vector<Op> out;
  out.swap(ops_);
  return out;
}

int64_t Recorder::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(ops_.size());
}

Client::Client(const std::vector<std::string>& addresses, int worker,
               Recorder* recorder, absl::Duration deadline, uint64_t seed)
    : worker_(worker), recorder_(recorder), deadline_(deadline), rng_(seed) {
  for (const std::string& address : addresses) {
    grpc::ChannelArguments args;
    // Its own connection, and quick reconnects after a sidecar restart.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    auto channel = grpc::CreateCustomChannel(
        address, grpc::InsecureChannelCredentials(), args);
    stubs_.push_back(pb::Idempotency::NewStub(channel));
    admins_.push_back(pb::IdempotencyAdmin::NewStub(channel));
  }
}

int Client::Pick() {
  return static_cast<int>(
      Uniform(rng_, 0, static_cast<int64_t>(stubs_.size()) - 1));
}

std::unique_ptr<grpc::ClientContext> Client::Context() const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() +
                    absl::ToChronoNanoseconds(deadline_));
  return ctx;
}

Op Client::NewOp(OpType type, const std::string& key) {
  Op op;
  op.id = recorder_->NextId();
  op.worker = worker_;
  op.type = type;
  op.key = key;
  return op;
}

void Client::Finish(Op& op, const grpc::Status& status) {
  op.complete_ns = NowNs();
  op.code = static_cast<int>(status.error_code());
  op.result = Classify(status.error_code());
  if (!status.ok()) op.error = status.error_message().substr(0, 300);
  recorder_->Add(op);
}

Op Client::Begin(const std::string& key, const std::string& hash,
                 const std::string& attempt_id, int64_t lease_ms,
                 int64_t wait_ms) {
  Op op = NewOp(OpType::kBegin, key);
  op.attempt_id = attempt_id;
  op.request_hash = hash;
  op.lease_ms = lease_ms;
  pb::BeginRequest req;
  *req.mutable_key() = RecordKeyOf(key);
  req.set_request_hash(hash);
  req.set_attempt_id(attempt_id);
  req.mutable_lease()->set_seconds(lease_ms / 1000);
  req.mutable_lease()->set_nanos(static_cast<int32_t>(lease_ms % 1000) *
                                 1000000);
  if (wait_ms > 0) {
    req.mutable_wait()->set_seconds(wait_ms / 1000);
    req.mutable_wait()->set_nanos(static_cast<int32_t>(wait_ms % 1000) *
                                  1000000);
  }
  pb::BeginResponse resp;
  auto ctx = Context();
  op.invoke_ns = NowNs();
  grpc::Status s = stubs_[Pick()]->Begin(ctx.get(), req, &resp);
  if (s.ok()) {
    op.outcome = resp.outcome();
    op.granted_token = resp.fencing_token();
    op.has_record = resp.has_record();
    op.record = resp.record();
    last_retry_after_ = absl::Seconds(resp.retry_after().seconds()) +
                        absl::Nanoseconds(resp.retry_after().nanos());
  }
  Finish(op, s);
  return op;
}

Op Client::Complete(const std::string& key, int64_t token,
                    const pb::Snapshot& result) {
  Op op = NewOp(OpType::kComplete, key);
  op.token = token;
  op.snapshot = result;
  pb::CompleteRequest req;
  *req.mutable_key() = RecordKeyOf(key);
  req.set_fencing_token(token);
  *req.mutable_result() = result;
  pb::CompleteResponse resp;
  auto ctx = Context();
  op.invoke_ns = NowNs();
  grpc::Status s = stubs_[Pick()]->Complete(ctx.get(), req, &resp);
  if (s.ok()) {
    op.has_record = resp.has_record();
    op.record = resp.record();
  }
  Finish(op, s);
  return op;
}

Op Client::Fail(const std::string& key, int64_t token,
                const pb::Snapshot& error, bool retryable) {
  Op op = NewOp(OpType::kFail, key);
  op.token = token;
  op.snapshot = error;
  op.retryable = retryable;
  pb::FailRequest req;
  *req.mutable_key() = RecordKeyOf(key);
  req.set_fencing_token(token);
  *req.mutable_error() = error;
  req.set_retryable(retryable);
  pb::FailResponse resp;
  auto ctx = Context();
  op.invoke_ns = NowNs();
  grpc::Status s = stubs_[Pick()]->Fail(ctx.get(), req, &resp);
  if (s.ok()) {
    op.has_record = resp.has_record();
    op.record = resp.record();
  }
  Finish(op, s);
  return op;
}

Op Client::Get(const std::string& key) {
  Op op = NewOp(OpType::kGet, key);
  pb::GetRequest req;
  *req.mutable_key() = RecordKeyOf(key);
  pb::GetResponse resp;
  auto ctx = Context();
  op.invoke_ns = NowNs();
  grpc::Status s = stubs_[Pick()]->Get(ctx.get(), req, &resp);
  if (s.ok()) {
    op.has_record = resp.has_record();
    op.record = resp.record();
  }
  Finish(op, s);
  return op;
}

Op Client::Resolve(const std::string& key, pb::Status to,
                   const pb::Snapshot& result, bool retryable, int64_t expected,
                   const std::string& actor, const std::string& reason) {
  Op op = NewOp(OpType::kResolve, key);
  op.resolve_to = to;
  op.snapshot = result;
  op.retryable = retryable;
  op.token = expected;
  op.actor = actor;
  pb::ResolveRequest req;
  *req.mutable_key() = RecordKeyOf(key);
  req.set_to(to);
  *req.mutable_result() = result;
  req.set_retryable(retryable);
  req.set_reason(reason);
  req.set_actor(actor);
  req.set_expected_fencing_token(expected);
  pb::ResolveResponse resp;
  auto ctx = Context();
  op.invoke_ns = NowNs();
  grpc::Status s = admins_[Pick()]->Resolve(ctx.get(), req, &resp);
  if (s.ok()) {
    op.has_record = resp.has_record();
    op.record = resp.record();
  }
  Finish(op, s);
  return op;
}

Op Client::ListUnknown(std::vector<pb::Record>* records) {
  Op op = NewOp(OpType::kList, "");
  pb::ListRequest req;
  req.set_tenant(kTenant);
  req.set_status(pb::STATUS_UNKNOWN);
  req.set_page_size(200);
  pb::ListResponse resp;
  auto ctx = Context();
  op.invoke_ns = NowNs();
  grpc::Status s = admins_[Pick()]->List(ctx.get(), req, &resp);
  if (s.ok()) records->assign(resp.records().begin(), resp.records().end());
  Finish(op, s);
  return op;
}

Ledger::Ledger(std::string conninfo, Recorder* recorder)
    : conninfo_(std::move(conninfo)), recorder_(recorder) {}

Ledger::~Ledger() = default;

pqxx::connection* Ledger::Connection() {
  if (conn_ == nullptr || !conn_->is_open()) {
    conn_.reset();
    conn_ = std::make_unique<pqxx::connection>(
        conninfo_ +
        " application_name=faults-ledger connect_timeout=2 keepalives=1"
        " keepalives_idle=2 keepalives_interval=1 keepalives_count=2");
  }
  return conn_.get();
}

Op Ledger::Write(const std::string& key, int64_t token,
                 const std::string& writer, int worker) {
  Op op;
  op.id = recorder_->NextId();
  op.worker = worker;
  op.type = OpType::kEffect;
  op.key = key;
  op.token = token;
  op.actor = writer;
  op.invoke_ns = NowNs();
  try {
    pqxx::work tx(*Connection());
    pqxx::row row = tx.exec_params1(kFencedInsert, key, token, writer);
    tx.commit();
    if (row[0].as<int64_t>() > 0) {
      op.result = Result::kOk;
    } else {
      op.result = Result::kFail;
      op.code = 9;
      op.error = "fenced off: a higher token wrote first";
    }
  } catch (const std::exception& e) {
    // Broken connection, commit in doubt, server shutting down: unknown.
    op.result = Result::kInfo;
    op.code = 14;
    op.error = std::string(e.what()).substr(0, 300);
    conn_.reset();
  }
  op.complete_ns = NowNs();
  recorder_->Add(op);
  return op;
}

std::optional<bool> Ledger::Has(const std::string& key, int64_t token) {
  try {
    pqxx::work tx(*Connection());
    pqxx::row row = tx.exec_params1(
        "SELECT EXISTS (SELECT 1 FROM faults_effect WHERE key = $1"
        " AND token = $2)",
        key, token);
    tx.commit();
    return row[0].as<bool>();
  } catch (const std::exception&) {
    conn_.reset();
    return std::nullopt;
  }
}

void Shared::AddKnown(const std::string& key) {
  absl::MutexLock lock(&mu_);
  known_.push_back(key);
}

std::optional<std::string> Shared::RandomKnown(std::mt19937_64& rng) {
  absl::MutexLock lock(&mu_);
  if (known_.empty()) return std::nullopt;
  // Mostly recent keys (they are the ones still moving), sometimes any.
  const int64_t n = static_cast<int64_t>(known_.size());
  int64_t i = Unit(rng) < 0.7
                  ? n - 1 - Uniform(rng, 0, std::min<int64_t>(n - 1, 200))
                  : Uniform(rng, 0, n - 1);
  return known_[i];
}

void Shared::AddUnknown(const std::string& key) {
  absl::MutexLock lock(&mu_);
  unknown_.insert(key);
}

void Shared::RemoveUnknown(const std::string& key) {
  absl::MutexLock lock(&mu_);
  unknown_.erase(key);
}

std::optional<std::string> Shared::RandomUnknown(std::mt19937_64& rng) {
  absl::MutexLock lock(&mu_);
  if (unknown_.empty()) return std::nullopt;
  auto it = unknown_.begin();
  std::advance(it, Uniform(rng, 0, static_cast<int64_t>(unknown_.size()) - 1));
  return *it;
}

void Shared::SetFocus(std::vector<std::string> keys) {
  absl::MutexLock lock(&mu_);
  focus_ = std::move(keys);
}

std::optional<std::string> Shared::RandomFocus(std::mt19937_64& rng) {
  absl::MutexLock lock(&mu_);
  if (focus_.empty()) return std::nullopt;
  return focus_[Uniform(rng, 0, static_cast<int64_t>(focus_.size()) - 1)];
}

pb::Outcome RunIntent(Client& client, Ledger& ledger, Shared* shared,
                      std::mt19937_64& rng, const std::string& key,
                      const std::string& attempt_id,
                      const IntentOptions& options) {
  const std::string hash = IntentHash(key);
  const int64_t give_up = absl::ToInt64Nanoseconds(options.give_up);
  int64_t deadline = NowNs() + give_up;
  int in_progress = 0;
  Op op;
  while (true) {
    op = client.Begin(key, hash, attempt_id, options.lease_ms);
    if (op.result == Result::kInfo) {
      if (NowNs() > deadline) return pb::OUTCOME_UNSPECIFIED;
      SleepMs(Uniform(rng, 30, 150));
      continue;
    }
    if (op.result == Result::kFail) return pb::OUTCOME_UNSPECIFIED;
    if (shared != nullptr) shared->AddKnown(key);
    if (op.outcome == pb::OUTCOME_IN_PROGRESS &&
        ++in_progress <= options.max_in_progress) {
      SleepMs(std::min<int64_t>(
          300, absl::ToInt64Milliseconds(client.last_retry_after())));
      continue;
    }
    break;
  }
  if (shared != nullptr) {
    if (op.outcome == pb::OUTCOME_UNKNOWN) {
      shared->AddUnknown(key);
    } else {
      shared->RemoveUnknown(key);
    }
  }
  if (op.outcome != pb::OUTCOME_ACQUIRED) return op.outcome;
  const int64_t token = op.granted_token;
  if (options.on_grant) options.on_grant(key, token);
  // A crashed caller: before its effect, or after it.
  if (options.abandon && Unit(rng) < 0.5) return op.outcome;
  const std::string writer = client.worker() >= 1000
                                 ? absl::StrCat("holder", client.worker())
                                 : absl::StrCat("w", client.worker());
  deadline = NowNs() + give_up;
  Op effect;
  while (true) {
    effect = ledger.Write(key, token, writer, client.worker());
    if (effect.result != Result::kInfo || NowNs() > deadline) break;
    SleepMs(Uniform(rng, 50, 150));
  }
  if (options.abandon || effect.result == Result::kInfo) return op.outcome;
  // Report. A fenced-off effect is reported too: the sidecar must refuse
  // the stale token.
  const double r = Unit(rng);
  const bool fail = r < options.p_fail_retryable + options.p_fail_final;
  const bool retryable = r < options.p_fail_retryable;
  const pb::Snapshot snapshot = TaggedSnapshot(
      {key, token, writer}, fail ? (retryable ? 503 : 422) : 201, rng());
  deadline = NowNs() + give_up;
  while (true) {
    Op report = fail ? client.Fail(key, token, snapshot, retryable)
                     : client.Complete(key, token, snapshot);
    if (report.result != Result::kInfo || NowNs() > deadline) break;
    SleepMs(Uniform(rng, 30, 150));
  }
  return op.outcome;
}

Workload::Workload(WorkloadOptions options, std::vector<std::string> addresses,
                   std::string conninfo, uint64_t seed, Recorder* recorder)
    : options_(options),
      addresses_(std::move(addresses)),
      conninfo_(std::move(conninfo)),
      seed_(seed),
      recorder_(recorder) {}

Workload::~Workload() { Stop(); }

void Workload::Start() {
  for (int i = 0; i < options_.workers; ++i) {
    threads_.emplace_back([this, i] { WorkerLoop(i); });
  }
  for (int i = 0; i < options_.operators; ++i) {
    threads_.emplace_back([this, i] { OperatorLoop(i); });
  }
}

void Workload::Stop() {
  shared_.stop.store(true);
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

void Workload::WorkerLoop(int index) {
  std::mt19937_64 rng(seed_ * 1000003 + static_cast<uint64_t>(index));
  Client client(addresses_, index, recorder_, options_.call_deadline, rng());
  Ledger ledger(conninfo_, recorder_);
  IntentOptions io;
  io.lease_ms = options_.lease_ms;
  io.p_fail_retryable = options_.p_fail_retryable;
  io.p_fail_final = options_.p_fail_final;
  io.give_up = options_.give_up;
  const std::string suffix = absl::StrCat("-", seed_ % 100000);
  int64_t seq = 0;
  while (!shared_.stop.load()) {
    ++seq;
    const std::string attempt = absl::StrCat("w", index, "-", seq, suffix);
    double r = Unit(rng);
    auto pick = [&r](double p) {
      const bool hit = r < p;
      r -= p;
      return hit;
    };
    if (pick(options_.p_focus)) {
      if (auto key = shared_.RandomFocus(rng)) {
        RunIntent(client, ledger, &shared_, rng, *key, attempt, io);
        continue;
      }
    }
    if (pick(options_.p_replay)) {
      if (auto key = shared_.RandomKnown(rng)) {
        RunIntent(client, ledger, &shared_, rng, *key, attempt, io);
        continue;
      }
    }
    if (pick(options_.p_probe)) {
      if (auto key = shared_.RandomKnown(rng)) {
        client.Begin(*key, OtherHash(*key), attempt, options_.lease_ms);
        continue;
      }
    }
    if (pick(options_.p_get)) {
      if (auto key = shared_.RandomKnown(rng)) {
        Op op = client.Get(*key);
        if (op.result == Result::kOk &&
            op.record.status() == pb::STATUS_UNKNOWN) {
          shared_.AddUnknown(*key);
        }
        continue;
      }
    }
    if (pick(options_.p_chase)) {
      if (auto key = shared_.RandomUnknown(rng)) {
        IntentOptions chase = io;
        chase.max_in_progress = 1;
        RunIntent(client, ledger, &shared_, rng, *key, attempt, chase);
        continue;
      }
    }
    if (pick(options_.p_hot)) {
      const int64_t generation =
          (NowNs() - shared_.start_ns) /
          absl::ToInt64Nanoseconds(options_.hot_rotation);
      const int64_t i = Uniform(rng, 0, options_.hot_keys - 1);
      const std::string key = absl::StrCat(i % 4 == 0 ? kReleaseOp : kUnknownOp,
                                           "/hot-", generation, "-", i, suffix);
      RunIntent(client, ledger, &shared_, rng, key, attempt, io);
      continue;
    }
    const std::string key = absl::StrCat(
        Unit(rng) < options_.p_release_op ? kReleaseOp : kUnknownOp, "/",
        attempt);
    if (pick(options_.p_abandon)) {
      IntentOptions abandon = io;
      abandon.abandon = true;
      abandon.lease_ms = options_.abandon_lease_ms;
      RunIntent(client, ledger, &shared_, rng, key, attempt, abandon);
      continue;
    }
    RunIntent(client, ledger, &shared_, rng, key, attempt, io);
  }
}

void Workload::OperatorLoop(int index) {
  std::mt19937_64 rng(seed_ * 7919 + 100 + static_cast<uint64_t>(index));
  Client client(addresses_, -1 - index, recorder_, options_.call_deadline,
                rng());
  Ledger ledger(conninfo_, recorder_);
  const std::string actor = absl::StrCat("operator-", index);
  while (!shared_.stop.load()) {
    absl::SleepFor(options_.operator_interval);
    std::vector<pb::Record> records;
    if (client.ListUnknown(&records).result != Result::kOk) continue;
    std::shuffle(records.begin(), records.end(), rng);
    if (records.size() > 40) records.resize(40);
    for (const pb::Record& rec : records) {
      if (shared_.stop.load()) break;
      const std::string key =
          absl::StrCat(rec.key().operation(), "/", rec.key().key());
      const int64_t t = rec.fencing_token();
      pb::Status to;
      bool retryable = false;
      std::string why;
      if (Unit(rng) < options_.operator_follow_ledger) {
        std::optional<bool> has = ledger.Has(key, t);
        if (!has) continue;
        to = *has ? pb::STATUS_SUCCEEDED : pb::STATUS_FAILED;
        retryable = !*has;
        why = *has ? "the ledger has the effect" : "no effect in the ledger";
      } else {
        // Operators disagree: resolve-race runs several that pick apart.
        const int64_t c = (Uniform(rng, 0, 2) + index) % 3;
        to = c == 0 ? pb::STATUS_SUCCEEDED : pb::STATUS_FAILED;
        retryable = c == 1;
        why = "by guess";
      }
      const pb::Snapshot snapshot = TaggedSnapshot(
          {key, t, actor}, to == pb::STATUS_SUCCEEDED ? 200 : 500, rng());
      const std::string reason = absl::StrCat("faults: ", why);
      for (int attempt = 0; attempt < 3; ++attempt) {
        Op op = client.Resolve(key, to, snapshot, retryable, t, actor, reason);
        if (op.result != Result::kInfo) break;
        SleepMs(100);
      }
    }
  }
}

int RunHolder(const HolderOptions& options) {
  Recorder recorder(/*first_id=*/1000000000);
  Client client(options.addresses, options.worker, &recorder, absl::Seconds(2),
                options.seed);
  Ledger ledger(options.conninfo, &recorder);
  std::mt19937_64 rng(options.seed);
  std::ofstream out(options.out_path, std::ios::app);
  for (int i = 0; i < options.keys; ++i) {
    const std::string key = absl::StrCat(i % 2 == 0 ? kReleaseOp : kUnknownOp,
                                         "/holder-", options.seed, "-", i);
    IntentOptions io;
    io.lease_ms = options.lease_ms;
    io.on_grant = [&](const std::string& k, int64_t token) {
      // The ops so far go out first: if this process never comes back, its
      // grant is still in the history.
      for (const Op& op : recorder.Take()) out << FormatOp(op) << "\n";
      out.flush();
      std::printf("GRANTED %s %lld\n", k.c_str(),
                  static_cast<long long>(token));
      std::fflush(stdout);
      // Paused past the lease, as by a long GC or a stalled VM; the harness
      // lets rivals in, then continues this process.
      raise(SIGSTOP);
    };
    RunIntent(client, ledger, nullptr, rng, key, absl::StrCat("holder-", i),
              io);
    for (const Op& op : recorder.Take()) out << FormatOp(op) << "\n";
    out.flush();
    std::printf("DONE %s\n", key.c_str());
    std::fflush(stdout);
  }
  return out ? 0 : 1;
}

}  // namespace idem::faults
