#include "bench/load.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "idempotency/v1/idempotency.grpc.pb.h"

namespace idem::bench {
namespace {

namespace pb = ::idempotency::v1;
using Clock = std::chrono::steady_clock;

// With a target rate, how long before a scheduled start a worker stops
// blocking on its queue, and how long it then sleeps between polls.
constexpr std::chrono::microseconds kCoarseWait(2000);
constexpr std::chrono::microseconds kPollStep(50);

// What one request does; kPreload creates a key of the replay pool.
enum class Kind { kFresh, kReplay, kContend, kPreload };
enum class Stage { kBegin, kComplete };

const char* CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return "OK";
    case grpc::StatusCode::CANCELLED:
      return "CANCELLED";
    case grpc::StatusCode::UNKNOWN:
      return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED:
      return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE:
      return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL:
      return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS:
      return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    default:
      return "UNRECOGNIZED";
  }
}

int64_t Micros(Clock::duration d) {
  return std::chrono::duration_cast<std::chrono::microseconds>(d).count();
}

std::chrono::system_clock::time_point SystemDeadline(Clock::time_point t) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(
             t - Clock::now());
}

Clock::duration ToClock(absl::Duration d) {
  return std::chrono::duration_cast<Clock::duration>(
      absl::ToChronoNanoseconds(d));
}

// One channel per thread: a private subchannel pool and a distinct argument
// keep channels from sharing a TCP connection.
std::shared_ptr<grpc::Channel> NewChannel(const std::string& target,
                                          int index) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt("idem.bench.channel", index);
  args.SetMaxReceiveMessageSize(64 << 20);
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(),
                                   args);
}

// State every thread of one run shares.
struct Shared {
  explicit Shared(const LoadOptions& o) : options(o) {}

  const LoadOptions& options;
  bool preload = false;
  // Distinguishes this run's contention keys from earlier runs'.
  std::string run_id;
  std::string hash;
  std::string body;
  // Contention: the current generation of each hot key.
  std::unique_ptr<std::atomic<uint64_t>[]> generations;
  // Preload: the next pool key to create.
  std::atomic<int64_t> next_preload{0};
  Clock::time_point measure_from;
  Clock::time_point end;
};

// One outstanding request and the buffers of its calls.
struct Slot {
  Kind kind = Kind::kFresh;
  Stage stage = Stage::kBegin;
  int hot = -1;
  uint64_t generation = 0;
  Clock::time_point scheduled;
  Clock::time_point sent;
  std::unique_ptr<grpc::ClientContext> context;
  pb::BeginRequest begin;
  pb::BeginResponse begin_response;
  pb::CompleteRequest complete;
  pb::CompleteResponse complete_response;
  grpc::Status status;
  // Declared after `context`, so destroyed before it.
  std::unique_ptr<grpc::ClientAsyncResponseReader<pb::BeginResponse>>
      begin_call;
  std::unique_ptr<grpc::ClientAsyncResponseReader<pb::CompleteResponse>>
      complete_call;
};

// A CompletionQueue thread driving `slots` requests over its own channel.
class Worker {
 public:
  Worker(Shared* shared, int index, int slots, double rate)
      : shared_(shared),
        options_(shared->options),
        stub_(pb::Idempotency::NewStub(NewChannel(options_.target, index))),
        slots_(slots),
        rng_(std::random_device{}() ^ (static_cast<uint64_t>(index) << 32)) {
    if (rate > 0) {
      open_loop_ = true;
      gap_ = std::exponential_distribution<double>(rate);
    }
    for (Slot& s : slots_) {
      s.begin.mutable_key()->set_tenant(options_.tenant);
      s.begin.set_request_hash(shared_->hash);
      s.complete.mutable_key()->set_tenant(options_.tenant);
      pb::Snapshot* result = s.complete.mutable_result();
      result->set_code(200);
      result->set_body(shared_->body);
      result->set_content_type("application/octet-stream");
    }
    next_due_ = Clock::now() + NextGap();
  }

  void Run() {
    std::vector<Slot*> idle;
    for (Slot& s : slots_) {
      if (open_loop_ || !Start(&s, Clock::now())) idle.push_back(&s);
    }
    bool stopping = false;
    const Clock::time_point drain_until =
        shared_->end + ToClock(options_.rpc_timeout) + std::chrono::seconds(5);
    while (true) {
      Clock::time_point now = Clock::now();
      if (!stopping &&
          (now >= shared_->end || (shared_->preload && outstanding_ == 0))) {
        stopping = true;
      }
      if (open_loop_ && !stopping) {
        while (!idle.empty() && next_due_ <= now) {
          Slot* s = idle.back();
          idle.pop_back();
          Start(s, next_due_);
          next_due_ += NextGap();
        }
      }
      if (stopping && outstanding_ == 0) break;
      // gRPC's timers have millisecond resolution: wait on the queue until
      // shortly before the next scheduled start, then poll it and sleep in
      // short steps, so that requests start on time.
      Clock::time_point wake = shared_->end;
      bool precise = false;
      if (stopping) {
        wake = drain_until;
      } else if (open_loop_ && !idle.empty()) {
        if (next_due_ - now > kCoarseWait) {
          wake = std::min(next_due_ - kCoarseWait, shared_->end);
        } else {
          precise = true;
        }
      }
      void* tag = nullptr;
      bool ok = false;
      // A deadline of "now" may be rounded up to the next millisecond; the
      // epoch is surely past and makes AsyncNext a poll.
      grpc::CompletionQueue::NextStatus next =
          cq_.AsyncNext(&tag, &ok,
                        precise ? std::chrono::system_clock::time_point()
                                : SystemDeadline(wake));
      if (next == grpc::CompletionQueue::SHUTDOWN) break;
      if (next == grpc::CompletionQueue::TIMEOUT) {
        if (stopping && Clock::now() >= drain_until) break;
        if (precise) {
          std::this_thread::sleep_for(
              std::min<Clock::duration>(next_due_ - Clock::now(), kPollStep));
        }
        continue;
      }
      Slot* s = static_cast<Slot*>(tag);
      if (!OnDone(s)) idle.push_back(s);
    }
    cq_.Shutdown();
    void* tag = nullptr;
    bool ok = false;
    while (cq_.Next(&tag, &ok)) {
    }
  }

  LoadResult& result() { return result_; }
  int64_t created() const { return created_; }

 private:
  // Picks the next request for `s` and sends its first call; false when
  // there is nothing left to do (preload finished).
  bool Start(Slot* s, Clock::time_point scheduled) {
    const LoadOptions& o = options_;
    if (shared_->preload) {
      const int64_t i = shared_->next_preload.fetch_add(1);
      if (i >= o.key_space) return false;
      s->kind = Kind::kPreload;
      SetKey(s, absl::StrCat(o.operation, "-replay"),
             absl::StrCat(o.key_prefix, i));
    } else {
      Scenario scenario = o.scenario;
      if (scenario == Scenario::kMixed) {
        scenario = std::uniform_real_distribution<double>(0, 1)(rng_) <
                           o.replay_fraction
                       ? Scenario::kReplay
                       : Scenario::kFresh;
      }
      switch (scenario) {
        case Scenario::kFresh:
        case Scenario::kMixed:
          s->kind = Kind::kFresh;
          SetKey(s, o.operation, absl::StrCat(rng_()));
          break;
        case Scenario::kReplay:
          s->kind = Kind::kReplay;
          SetKey(s, absl::StrCat(o.operation, "-replay"),
                 absl::StrCat(o.key_prefix, Uniform(o.key_space)));
          break;
        case Scenario::kContention: {
          s->kind = Kind::kContend;
          s->hot = static_cast<int>(Uniform(o.key_space));
          s->generation = shared_->generations[s->hot].load();
          SetKey(
              s, absl::StrCat(o.operation, "-contention"),
              absl::StrCat(shared_->run_id, "-", s->hot, "-", s->generation));
          break;
        }
      }
    }
    s->scheduled = scheduled;
    s->sent = Clock::now();
    ++outstanding_;
    SendBegin(s);
    return true;
  }

  // The time to the next scheduled start: exponential, so that starts form
  // a Poisson process, as pgbench --rate schedules them.
  Clock::duration NextGap() {
    return std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(gap_(rng_)));
  }

  uint64_t Uniform(int n) {
    return std::uniform_int_distribution<uint64_t>(
        0, static_cast<uint64_t>(std::max(1, n)) - 1)(rng_);
  }

  static void SetKey(Slot* s, const std::string& operation,
                     const std::string& key) {
    pb::RecordKey* k = s->begin.mutable_key();
    k->set_operation(operation);
    k->set_key(key);
    *s->complete.mutable_key() = *k;
  }

  void NewContext(Slot* s) {
    // A reader lives in its call's arena, which its context owns: readers go
    // first.
    s->begin_call.reset();
    s->complete_call.reset();
    s->context = std::make_unique<grpc::ClientContext>();
    s->context->set_deadline(std::chrono::system_clock::now() +
                             absl::ToChronoNanoseconds(options_.rpc_timeout));
  }

  void SendBegin(Slot* s) {
    s->stage = Stage::kBegin;
    NewContext(s);
    s->begin_call = stub_->PrepareAsyncBegin(s->context.get(), s->begin, &cq_);
    s->begin_call->StartCall();
    s->begin_call->Finish(&s->begin_response, &s->status, s);
  }

  void SendComplete(Slot* s, int64_t token) {
    s->stage = Stage::kComplete;
    s->complete.set_fencing_token(token);
    NewContext(s);
    s->complete_call =
        stub_->PrepareAsyncComplete(s->context.get(), s->complete, &cq_);
    s->complete_call->StartCall();
    s->complete_call->Finish(&s->complete_response, &s->status, s);
  }

  bool Measured(Clock::time_point t) const {
    return t >= shared_->measure_from && t < shared_->end;
  }

  // Handles the answer of the call in flight for `s`; false when the slot
  // goes idle.
  bool OnDone(Slot* s) {
    const Clock::time_point now = Clock::now();
    ++result_.rpcs_total;
    if (Measured(now)) ++result_.rpcs;
    if (!s->status.ok()) {
      ++result_.errors[CodeName(s->status.error_code())];
      return Finish(s, now, false);
    }
    if (s->stage == Stage::kComplete) {
      if (s->kind == Kind::kContend) {
        uint64_t g = s->generation;
        shared_->generations[s->hot].compare_exchange_strong(g, g + 1);
      }
      if (s->kind == Kind::kPreload) ++created_;
      return Finish(s, now, true);
    }
    const pb::Outcome outcome = s->begin_response.outcome();
    ++result_.outcomes[pb::Outcome_Name(outcome)];
    bool expected = false;
    switch (s->kind) {
      case Kind::kFresh:
        expected = outcome == pb::OUTCOME_ACQUIRED;
        break;
      case Kind::kPreload:
      case Kind::kContend:
        expected =
            outcome == pb::OUTCOME_ACQUIRED ||
            outcome == pb::OUTCOME_COMPLETED ||
            (s->kind == Kind::kContend && outcome == pb::OUTCOME_IN_PROGRESS);
        break;
      case Kind::kReplay:
        expected = outcome == pb::OUTCOME_COMPLETED;
        break;
    }
    if (!expected) {
      ++result_.errors[pb::Outcome_Name(outcome)];
      return Finish(s, now, false);
    }
    if (outcome == pb::OUTCOME_ACQUIRED) {
      SendComplete(s, s->begin_response.fencing_token());
      return true;
    }
    return Finish(s, now, true);
  }

  // Accounts for a finished request and, in a closed loop, starts the next.
  bool Finish(Slot* s, Clock::time_point now, bool success) {
    --outstanding_;
    if (success) {
      ++result_.requests_total;
      if (Measured(now)) {
        ++result_.requests;
        result_.latency_us.Record(Micros(now - s->scheduled));
        result_.service_us.Record(Micros(now - s->sent));
        result_.start_lag_us.Record(Micros(s->sent - s->scheduled));
      }
    }
    if (open_loop_ || now >= shared_->end) {
      return false;
    }
    return Start(s, now);
  }

  Shared* const shared_;
  const LoadOptions& options_;
  grpc::CompletionQueue cq_;
  std::unique_ptr<pb::Idempotency::Stub> stub_;
  std::vector<Slot> slots_;
  std::mt19937_64 rng_;
  bool open_loop_ = false;
  std::exponential_distribution<double> gap_;
  Clock::time_point next_due_;
  int outstanding_ = 0;
  int64_t created_ = 0;
  LoadResult result_;
};

absl::Status Validate(const LoadOptions& o) {
  if (o.concurrency < 1) {
    return absl::InvalidArgumentError("--concurrency: must be at least 1");
  }
  if (o.threads < 1) {
    return absl::InvalidArgumentError("--threads: must be at least 1");
  }
  if (o.key_space < 1) {
    return absl::InvalidArgumentError("--key-space: must be at least 1");
  }
  if (o.duration <= absl::ZeroDuration() || o.warmup < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "--duration must be positive and --warmup not negative");
  }
  if (o.target_rate < 0) {
    return absl::InvalidArgumentError("--target-rate: must not be negative");
  }
  if (o.replay_fraction < 0 || o.replay_fraction > 1) {
    return absl::InvalidArgumentError("--replay-fraction: must be in [0, 1]");
  }
  return absl::OkStatus();
}

// Runs `shared` over min(threads, concurrency) workers and merges what they
// measured.
LoadResult RunWorkers(Shared* shared, int64_t* created) {
  const LoadOptions& o = shared->options;
  const int threads = std::min(o.threads, o.concurrency);
  std::vector<std::unique_ptr<Worker>> workers;
  for (int i = 0; i < threads; ++i) {
    const int slots = o.concurrency / threads + (i < o.concurrency % threads);
    workers.push_back(std::make_unique<Worker>(
        shared, i, slots, shared->preload ? 0 : o.target_rate / threads));
  }
  std::vector<std::thread> running;
  running.reserve(workers.size());
  for (auto& w : workers) running.emplace_back([&w] { w->Run(); });
  for (std::thread& t : running) t.join();
  LoadResult total;
  for (auto& w : workers) {
    const LoadResult& r = w->result();
    total.requests += r.requests;
    total.rpcs += r.rpcs;
    total.requests_total += r.requests_total;
    total.rpcs_total += r.rpcs_total;
    total.latency_us.Merge(r.latency_us);
    total.service_us.Merge(r.service_us);
    total.start_lag_us.Merge(r.start_lag_us);
    for (const auto& [name, n] : r.errors) total.errors[name] += n;
    for (const auto& [name, n] : r.outcomes) total.outcomes[name] += n;
    if (created != nullptr) *created += w->created();
  }
  return total;
}

std::string RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string out(n, '\0');
  for (char& c : out) c = static_cast<char>(rng() & 0xff);
  return out;
}

void InitShared(Shared* shared) {
  const LoadOptions& o = shared->options;
  // The same hash for every request, so replays of preloaded keys match.
  shared->hash = std::string(32, '\xab');
  shared->body = RandomBytes(o.snapshot_bytes, std::random_device{}());
  shared->run_id = absl::StrCat(
      absl::Hex(std::random_device{}() ^ absl::ToUnixNanos(absl::Now())));
  shared->generations = std::make_unique<std::atomic<uint64_t>[]>(o.key_space);
  for (int i = 0; i < o.key_space; ++i) shared->generations[i].store(0);
}

}  // namespace

absl::StatusOr<Scenario> ParseScenario(const std::string& name) {
  if (name == "fresh") return Scenario::kFresh;
  if (name == "replay" || name == "replay-redis" || name == "replay-pg") {
    return Scenario::kReplay;
  }
  if (name == "contention") return Scenario::kContention;
  if (name == "mixed") return Scenario::kMixed;
  return absl::InvalidArgumentError(absl::StrCat(
      "--scenario: \"", name,
      "\" is not fresh, replay, replay-redis, replay-pg, contention or "
      "mixed"));
}

const char* ScenarioName(Scenario s) {
  switch (s) {
    case Scenario::kFresh:
      return "fresh";
    case Scenario::kReplay:
      return "replay";
    case Scenario::kContention:
      return "contention";
    case Scenario::kMixed:
      return "mixed";
  }
  return "?";
}

int64_t LoadResult::ErrorCount() const {
  int64_t n = 0;
  for (const auto& [name, count] : errors) n += count;
  return n;
}

absl::StatusOr<int64_t> Preload(const LoadOptions& options) {
  absl::Status s = Validate(options);
  if (!s.ok()) return s;
  Shared shared(options);
  InitShared(&shared);
  shared.preload = true;
  shared.measure_from = Clock::now();
  // Preload ends when the pool is done; this only bounds a stuck run.
  shared.end = shared.measure_from + std::chrono::hours(24);
  int64_t created = 0;
  LoadResult r = RunWorkers(&shared, &created);
  if (r.ErrorCount() > 0) {
    std::string detail;
    for (const auto& [name, n] : r.errors) {
      absl::StrAppend(&detail, detail.empty() ? "" : ", ", name, "=", n);
    }
    return absl::UnavailableError(absl::StrCat("preload of ", options.key_space,
                                               " keys: ", r.ErrorCount(),
                                               " calls failed (", detail, ")"));
  }
  return created;
}

absl::StatusOr<LoadResult> RunLoad(const LoadOptions& options) {
  absl::Status s = Validate(options);
  if (!s.ok()) return s;
  Shared shared(options);
  InitShared(&shared);
  const Clock::time_point start = Clock::now();
  shared.measure_from = start + ToClock(options.warmup);
  shared.end = shared.measure_from + ToClock(options.duration);
  LoadResult r = RunWorkers(&shared, nullptr);
  r.measured_seconds = absl::ToDoubleSeconds(options.duration);
  return r;
}

absl::Status WaitServing(const std::string& target, absl::Duration timeout) {
  // Retry connecting every 100 ms rather than with gRPC's default backoff
  // (1 s, growing), so that a server that just started is seen at once.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 100);
  auto stub = grpc::health::v1::Health::NewStub(grpc::CreateCustomChannel(
      target, grpc::InsecureChannelCredentials(), args));
  const absl::Time deadline = absl::Now() + timeout;
  std::string last = "no answer";
  while (absl::Now() < deadline) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(1));
    context.set_wait_for_ready(true);
    grpc::health::v1::HealthCheckRequest request;
    grpc::health::v1::HealthCheckResponse response;
    grpc::Status status = stub->Check(&context, request, &response);
    if (status.ok() &&
        response.status() == grpc::health::v1::HealthCheckResponse::SERVING) {
      return absl::OkStatus();
    }
    last = status.ok()
               ? grpc::health::v1::HealthCheckResponse::ServingStatus_Name(
                     response.status())
               : absl::StrCat(CodeName(status.error_code()), ": ",
                              status.error_message());
    absl::SleepFor(absl::Milliseconds(100));
  }
  return absl::DeadlineExceededError(
      absl::StrCat(target, " not SERVING within ",
                   absl::FormatDuration(timeout), " (", last, ")"));
}

}  // namespace idem::bench
