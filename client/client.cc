#include "client/client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/sha256.h"
#include "common/proto_time.h"
#include "common/steady_wait.h"
#include "idempotency/v1/idempotency.grpc.pb.h"

namespace idem {
namespace {

// The lease assumed when the sidecar's answer does not say how long it
// granted: the smallest lease the sidecar allows by default, so that
// heartbeats come too often rather than too late.
constexpr absl::Duration kFallbackLease = absl::Seconds(1);
// Heartbeats never come more often than this.
constexpr absl::Duration kMinHeartbeatInterval = absl::Milliseconds(10);

absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      s.error_message());
}

// Returns true iff a call that ended with `code` may succeed when repeated.
bool Transient(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAVAILABLE ||
         code == grpc::StatusCode::DEADLINE_EXCEEDED;
}

// Returns true iff `code` says the holder's token is no longer current or
// the record is gone: a refused heartbeat or report.
bool Refused(absl::StatusCode code) {
  return code == absl::StatusCode::kFailedPrecondition ||
         code == absl::StatusCode::kNotFound;
}

absl::BitGen& Rng() {
  thread_local absl::BitGen gen;
  return gen;
}

// Returns a pause drawn uniformly from [b/2, b].
absl::Duration Jitter(absl::Duration b) {
  return b * absl::Uniform(Rng(), 0.5, 1.0);
}

// Exponential backoff without jitter: initial, initial*m, ... up to max.
class Backoff {
 public:
  explicit Backoff(const RetryOptions& options)
      : options_(options), next_(options.initial_backoff) {}

  absl::Duration Next() {
    const absl::Duration b = std::min(next_, options_.max_backoff);
    next_ = std::min(next_ * options_.multiplier, options_.max_backoff);
    return b;
  }
  void Reset() { next_ = options_.initial_backoff; }

 private:
  const RetryOptions options_;
  absl::Duration next_;
};

// Pauses for `d`, meanwhile letting `channel` (if not null) reconnect. (A
// sync gRPC client only polls a reconnection while a call waits on it; calls
// that fail fast while the channel is in TRANSIENT_FAILURE do not, so
// without this a restarted sidecar is noticed only by gRPC's 5 s backup
// poller.)
void Pause(grpc::Channel* channel, absl::Duration d) {
  const SteadyTime end = SteadyDeadline(d);
  if (channel != nullptr &&
      channel->GetState(/*try_to_connect=*/true) != GRPC_CHANNEL_READY) {
    // gRPC turns the wall-clock deadline into a monotonic one at once.
    channel->WaitForConnected(std::chrono::system_clock::now() +
                              absl::ToChronoNanoseconds(d));
  }
  absl::SleepFor(SteadyLeft(end));
}

std::string NewAttemptId() {
  return absl::StrFormat("%016x%016x", absl::Uniform<uint64_t>(Rng()),
                         absl::Uniform<uint64_t>(Rng()));
}

// The lease the sidecar granted with `record` (expiry minus the time of the
// acquisition), or kFallbackLease when the record does not tell.
absl::Duration GrantedLease(const pb::Record& record) {
  if (!record.has_lease_expires_at() || !record.has_updated_at()) {
    return kFallbackLease;
  }
  const absl::Duration d =
      FromProto(record.lease_expires_at()) - FromProto(record.updated_at());
  return d >= kFallbackLease ? d : kFallbackLease;
}

absl::StatusOr<std::string> ReadFile(const char* what,
                                     const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    const int err = errno;
    const std::string msg =
        absl::StrCat(what, ": cannot read ", path, ": ", std::strerror(err));
    return err == EACCES ? absl::PermissionDeniedError(msg)
                         : absl::NotFoundError(msg);
  }
  std::string out;
  char buf[8192];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) return absl::NotFoundError(absl::StrCat(what, ": read ", path));
  return out;
}

// INVALID_ARGUMENT naming the first bad option that does not concern TLS.
absl::Status ValidateOptions(const ClientOptions& o) {
  if (o.deadline <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("deadline: must be positive");
  }
  if (o.retry.max_attempts < 1) {
    return absl::InvalidArgumentError("retry.max_attempts: must be >= 1");
  }
  if (o.retry.initial_backoff <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "retry.initial_backoff: must be positive");
  }
  if (o.retry.max_backoff < o.retry.initial_backoff) {
    return absl::InvalidArgumentError(
        "retry.max_backoff: must be >= retry.initial_backoff");
  }
  if (!(o.retry.multiplier >= 1.0)) {
    return absl::InvalidArgumentError("retry.multiplier: must be >= 1");
  }
  for (char c : o.bearer_token) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(
          "bearer_token: only visible ASCII characters are allowed");
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string Fingerprint(absl::string_view canonical_request) {
  return Sha256Digest(canonical_request);
}

std::string FingerprintFields(std::initializer_list<absl::string_view> fields) {
  Sha256 h;
  for (absl::string_view field : fields) {
    char len[8];
    const uint64_t n = field.size();
    for (int i = 0; i < 8; ++i) len[i] = static_cast<char>(n >> (56 - 8 * i));
    h.Update(absl::string_view(len, sizeof(len)));
    h.Update(field);
  }
  return h.Finish();
}

pb::Snapshot MakeSnapshot(int32_t code, absl::string_view body,
                          absl::string_view content_type) {
  pb::Snapshot s;
  s.set_code(code);
  s.set_body(std::string(body));
  s.set_content_type(std::string(content_type));
  return s;
}

WriteResult WriteResult::Success(pb::Snapshot result) {
  return WriteResult(Kind::kSuccess, std::move(result));
}

WriteResult WriteResult::RetryableFailure(pb::Snapshot error) {
  return WriteResult(Kind::kRetryableFailure, std::move(error));
}

WriteResult WriteResult::FinalFailure(pb::Snapshot error) {
  return WriteResult(Kind::kFinalFailure, std::move(error));
}

WriteResult WriteResult::Unknown() {
  return WriteResult(Kind::kUnknown, pb::Snapshot());
}

Lease::Lease(pb::RecordKey key, int64_t fencing_token, Time expires)
    : key_(std::move(key)), fencing_token_(fencing_token), expires_(expires) {}

bool Lease::alive() const {
  absl::MutexLock lock(&mu_);
  return lost_.ok() && SteadyClock::now() < expires_;
}

absl::Status Lease::status() const {
  absl::MutexLock lock(&mu_);
  if (!lost_.ok()) return lost_;
  const Time now = SteadyClock::now();
  if (now >= expires_) {
    return absl::DeadlineExceededError(
        absl::StrCat("lease may have run out ",
                     absl::FormatDuration(absl::FromChrono(now - expires_)),
                     " ago: no heartbeat got through"));
  }
  return absl::OkStatus();
}

void Lease::Extend(Time expires) {
  absl::MutexLock lock(&mu_);
  expires_ = std::max(expires_, expires);
}

void Lease::Lose(const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  if (lost_.ok()) {
    lost_ = absl::Status(why.code(),
                         absl::StrCat("heartbeat refused: ", why.message()));
  }
}

const char* ExecuteResult::KindName(Kind kind) {
  switch (kind) {
    case Kind::kSucceeded:
      return "SUCCEEDED";
    case Kind::kFailed:
      return "FAILED";
    case Kind::kInProgress:
      return "IN_PROGRESS";
    case Kind::kUnknown:
      return "UNKNOWN";
    case Kind::kMismatch:
      return "MISMATCH";
    case Kind::kExpired:
      return "EXPIRED";
    case Kind::kLeaseLost:
      return "LEASE_LOST";
    case Kind::kUnreported:
      return "UNREPORTED";
  }
  return "?";
}

// The stub and what every call carries.
struct Client::Rpc {
  std::unique_ptr<pb::Idempotency::Stub> stub;
  // "Bearer <token>", or empty.
  std::string authorization;

  // Sets the deadline `timeout` from now and the metadata.
  void Prepare(grpc::ClientContext* ctx, absl::Duration timeout) const {
    ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    if (!authorization.empty()) {
      ctx->AddMetadata("authorization", authorization);
    }
  }
};

// Keeps a lease alive from a thread of its own: a Heartbeat every lease/3
// after the last one that got through, sooner (with backoff) after a failed
// one; stops for good when one is refused. The destructor stops the thread,
// cancelling a call in flight.
class Client::Heartbeater {
 public:
  Heartbeater(const Client& client, Lease* lease, absl::Duration lease_length,
              absl::Duration extend, SteadyTime last_sent)
      : client_(client),
        lease_(lease),
        lease_length_(lease_length),
        interval_(std::max(lease_length / 3, kMinHeartbeatInterval)),
        first_(SteadyDeadline(interval_, last_sent)) {
    request_.mutable_key()->CopyFrom(lease->key());
    request_.set_fencing_token(lease->fencing_token());
    if (extend > absl::ZeroDuration()) {
      *request_.mutable_extend() = DurationToProto(extend);
    }
    thread_ = std::thread([this] { Run(); });
  }

  Heartbeater(const Heartbeater&) = delete;
  Heartbeater& operator=(const Heartbeater&) = delete;

  ~Heartbeater() {
    {
      SteadyMutexLock lock(&mu_);
      stop_ = true;
      stopped_.SignalAll();
      if (inflight_ != nullptr) inflight_->TryCancel();
    }
    thread_.join();
  }

 private:
  // Returns false if asked to stop before `until`, true at `until`. When
  // `reconnect`, keeps the channel reconnecting meanwhile (see Pause).
  bool WaitUntil(SteadyTime until, bool reconnect) {
    grpc::Channel& channel = *client_.channel_;
    reconnect = reconnect && client_.own_channel_;
    while (true) {
      {
        SteadyMutexLock lock(&mu_);
        if (!reconnect) {
          return !stopped_.WaitUntil(
              &lock, until,
              [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; });
        }
        if (stop_) return false;
      }
      const absl::Duration left = SteadyLeft(until);
      if (left <= absl::ZeroDuration()) return true;
      if (channel.GetState(/*try_to_connect=*/true) == GRPC_CHANNEL_READY) {
        reconnect = false;
      } else {
        // Short slices, so that a stop is noticed soon.
        channel.WaitForConnected(
            std::chrono::system_clock::now() +
            absl::ToChronoNanoseconds(std::min(left, absl::Milliseconds(50))));
      }
    }
  }

  void Run() {
    Backoff backoff(client_.options_.retry);
    // A heartbeat may take up to a second even when heartbeats are more
    // frequent, but never longer than any other call.
    const absl::Duration timeout = std::min(
        client_.options_.deadline, std::max(interval_, absl::Seconds(1)));
    SteadyTime next = first_;
    bool failed = false;
    while (WaitUntil(next, failed)) {
      grpc::ClientContext ctx;
      client_.rpc_->Prepare(&ctx, timeout);
      {
        SteadyMutexLock lock(&mu_);
        if (stop_) return;
        inflight_ = &ctx;
      }
      const SteadyTime sent = SteadyClock::now();
      pb::HeartbeatResponse response;
      const grpc::Status s =
          client_.rpc_->stub->Heartbeat(&ctx, request_, &response);
      {
        SteadyMutexLock lock(&mu_);
        inflight_ = nullptr;
        if (stop_) return;
      }
      failed = !s.ok();
      if (s.ok()) {
        lease_->Extend(SteadyDeadline(lease_length_, sent));
        backoff.Reset();
        next = SteadyDeadline(interval_, sent);
      } else if (Refused(static_cast<absl::StatusCode>(s.error_code()))) {
        lease_->Lose(FromGrpc(s));
        return;
      } else {
        next = SteadyDeadline(Jitter(std::min(backoff.Next(), interval_)));
      }
    }
  }

  const Client& client_;
  Lease* const lease_;
  const absl::Duration lease_length_;
  const absl::Duration interval_;
  const SteadyTime first_;  // when the first heartbeat is due
  pb::HeartbeatRequest request_;
  SteadyMutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  SteadyCondVar stopped_;
  grpc::ClientContext* inflight_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::thread thread_;
};

absl::StatusOr<std::unique_ptr<Client>> Client::Create(
    const ClientOptions& options) {
  if (options.target.empty()) {
    return absl::InvalidArgumentError("target: empty");
  }
  absl::Status valid = ValidateOptions(options);
  if (!valid.ok()) return valid;
  const TlsOptions& tls = options.tls;
  if (!tls.enabled &&
      (!tls.root_ca_path.empty() || !tls.cert_chain_path.empty() ||
       !tls.private_key_path.empty() || !tls.server_name_override.empty())) {
    return absl::InvalidArgumentError(
        "tls: files or a server name are set but tls.enabled is false");
  }
  if (tls.cert_chain_path.empty() != tls.private_key_path.empty()) {
    return absl::InvalidArgumentError(
        "tls: cert_chain_path and private_key_path go together");
  }

  grpc::ChannelArguments args;
  args.SetUserAgentPrefix("idem-client-cpp");
  // A replayed record can be as large as the requests the sidecar accepts
  // (twice its --max-snapshot-bytes when that passes 2 MiB), past gRPC's
  // default 4 MiB.
  args.SetMaxReceiveMessageSize(-1);
  // Reconnect to a restarted sidecar about as fast as calls are retried.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
              static_cast<int>(
                  absl::ToInt64Milliseconds(options.retry.initial_backoff)));
  args.SetInt(
      GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
      static_cast<int>(absl::ToInt64Milliseconds(options.retry.max_backoff)));
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  if (tls.enabled) {
    grpc::SslCredentialsOptions ssl;
    if (!tls.root_ca_path.empty()) {
      absl::StatusOr<std::string> pem =
          ReadFile("tls.root_ca_path", tls.root_ca_path);
      if (!pem.ok()) return pem.status();
      ssl.pem_root_certs = *std::move(pem);
    }
    if (!tls.cert_chain_path.empty()) {
      absl::StatusOr<std::string> chain =
          ReadFile("tls.cert_chain_path", tls.cert_chain_path);
      if (!chain.ok()) return chain.status();
      absl::StatusOr<std::string> key =
          ReadFile("tls.private_key_path", tls.private_key_path);
      if (!key.ok()) return key.status();
      ssl.pem_cert_chain = *std::move(chain);
      ssl.pem_private_key = *std::move(key);
    }
    if (!tls.server_name_override.empty()) {
      args.SetSslTargetNameOverride(tls.server_name_override);
    }
    credentials = grpc::SslCredentials(ssl);
  } else {
    credentials = grpc::InsecureChannelCredentials();
  }
  return std::unique_ptr<Client>(new Client(
      options, grpc::CreateCustomChannel(options.target, credentials, args),
      /*own_channel=*/true));
}

absl::StatusOr<std::unique_ptr<Client>> Client::CreateWithChannel(
    std::shared_ptr<grpc::Channel> channel, const ClientOptions& options) {
  if (channel == nullptr) return absl::InvalidArgumentError("channel: null");
  absl::Status valid = ValidateOptions(options);
  if (!valid.ok()) return valid;
  return std::unique_ptr<Client>(
      new Client(options, std::move(channel), /*own_channel=*/false));
}

Client::Client(ClientOptions options, std::shared_ptr<grpc::Channel> channel,
               bool own_channel)
    : options_(std::move(options)),
      channel_(std::move(channel)),
      own_channel_(own_channel),
      rpc_(new Rpc{pb::Idempotency::NewStub(channel_),
                   options_.bearer_token.empty()
                       ? std::string()
                       : absl::StrCat("Bearer ", options_.bearer_token)}) {}

Client::~Client() = default;

pb::RecordKey Client::KeyOf(const RecordId& id) const {
  pb::RecordKey key;
  key.set_tenant(id.tenant.empty() ? options_.tenant : id.tenant);
  key.set_operation(id.operation);
  key.set_key(id.key);
  return key;
}

template <typename Response, typename Call>
absl::StatusOr<Response> Client::Retried(const Call& rpc,
                                         SteadyTime* sent) const {
  Backoff backoff(options_.retry);
  for (int attempt = 1;; ++attempt) {
    grpc::ClientContext ctx;
    rpc_->Prepare(&ctx, options_.deadline);
    if (attempt == 1 && sent != nullptr) *sent = SteadyClock::now();
    Response response;
    const grpc::Status s = rpc(&ctx, &response);
    if (s.ok()) return response;
    if (!Transient(s.error_code()) || attempt >= options_.retry.max_attempts) {
      return FromGrpc(s);
    }
    Pause(own_channel_ ? channel_.get() : nullptr, Jitter(backoff.Next()));
  }
}

namespace {

// Fills the default tenant into an empty key.tenant.
void FillTenant(const std::string& tenant, pb::RecordKey* key) {
  if (key->tenant().empty()) key->set_tenant(tenant);
}

}  // namespace

namespace {

// One unary call on `rpc` with the default tenant filled in, the deadline and
// the credentials.
template <typename Rpc, typename Request, typename Response>
absl::StatusOr<Response> Unary(
    const Rpc& rpc, const ClientOptions& options, Request request,
    grpc::Status (pb::Idempotency::Stub::*method)(grpc::ClientContext*,
                                                  const Request&, Response*)) {
  FillTenant(options.tenant, request.mutable_key());
  grpc::ClientContext ctx;
  rpc.Prepare(&ctx, options.deadline);
  Response response;
  absl::Status s =
      FromGrpc((rpc.stub.get()->*method)(&ctx, request, &response));
  if (!s.ok()) return s;
  return response;
}

}  // namespace

absl::StatusOr<pb::BeginResponse> Client::Begin(
    pb::BeginRequest request) const {
  return Unary(*rpc_, options_, std::move(request),
               &pb::Idempotency::Stub::Begin);
}

absl::StatusOr<pb::HeartbeatResponse> Client::Heartbeat(
    pb::HeartbeatRequest request) const {
  return Unary(*rpc_, options_, std::move(request),
               &pb::Idempotency::Stub::Heartbeat);
}

absl::StatusOr<pb::CompleteResponse> Client::Complete(
    pb::CompleteRequest request) const {
  return Unary(*rpc_, options_, std::move(request),
               &pb::Idempotency::Stub::Complete);
}

absl::StatusOr<pb::FailResponse> Client::Fail(pb::FailRequest request) const {
  return Unary(*rpc_, options_, std::move(request),
               &pb::Idempotency::Stub::Fail);
}

absl::StatusOr<pb::GetResponse> Client::Get(pb::GetRequest request) const {
  return Unary(*rpc_, options_, std::move(request),
               &pb::Idempotency::Stub::Get);
}

absl::StatusOr<ExecuteResult> Client::Execute(
    const RecordId& id, absl::string_view request_hash, const WriteFn& fn,
    const ExecuteOptions& options) const {
  if (!fn) return absl::InvalidArgumentError("fn: empty");
  if (options.lease < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("lease: negative");
  }
  if (options.wait < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("wait: negative");
  }
  pb::BeginRequest request;
  *request.mutable_key() = KeyOf(id);
  request.set_request_hash(std::string(request_hash));
  if (options.lease > absl::ZeroDuration()) {
    *request.mutable_lease() = DurationToProto(options.lease);
  }
  // One attempt id for every Begin of this Execute: a retry whose earlier
  // call was granted (but whose answer was lost) gets the grant back.
  request.set_attempt_id(NewAttemptId());
  const SteadyTime wait_until = SteadyDeadline(options.wait);
  Backoff backoff(options_.retry);
  while (true) {
    SteadyTime sent;
    absl::StatusOr<pb::BeginResponse> begun = Retried<pb::BeginResponse>(
        [&](grpc::ClientContext* ctx, pb::BeginResponse* response) {
          return rpc_->stub->Begin(ctx, request, response);
        },
        &sent);
    if (!begun.ok()) return begun.status();
    ExecuteResult r;
    r.record = begun->record();
    switch (begun->outcome()) {
      case pb::OUTCOME_ACQUIRED:
        return RunHolder(request.key(), *begun, sent, fn, options);
      case pb::OUTCOME_COMPLETED:
        r.kind = ExecuteResult::Kind::kSucceeded;
        r.replayed = true;
        r.snapshot = r.record.result();
        return r;
      case pb::OUTCOME_FAILED:
        r.kind = ExecuteResult::Kind::kFailed;
        r.replayed = true;
        r.snapshot = r.record.result();
        r.retryable = r.record.retryable();
        return r;
      case pb::OUTCOME_UNKNOWN:
        r.kind = ExecuteResult::Kind::kUnknown;
        return r;
      case pb::OUTCOME_MISMATCH:
        r.kind = ExecuteResult::Kind::kMismatch;
        return r;
      case pb::OUTCOME_EXPIRED:
        r.kind = ExecuteResult::Kind::kExpired;
        return r;
      case pb::OUTCOME_IN_PROGRESS: {
        r.kind = ExecuteResult::Kind::kInProgress;
        r.retry_after = FromProto(begun->retry_after());
        const absl::Duration left = SteadyLeft(wait_until);
        if (left <= absl::ZeroDuration()) return r;
        absl::Duration pause = backoff.Next();
        if (r.retry_after > absl::ZeroDuration()) {
          pause = std::min(pause, r.retry_after);
        }
        absl::SleepFor(std::min(Jitter(pause), left));
        break;
      }
      default:
        return absl::InternalError(
            absl::StrCat("Begin: unexpected outcome ", begun->outcome()));
    }
  }
}

ExecuteResult Client::RunHolder(const pb::RecordKey& key,
                                const pb::BeginResponse& begun, SteadyTime sent,
                                const WriteFn& fn,
                                const ExecuteOptions& options) const {
  const int64_t token = begun.fencing_token();
  const absl::Duration lease_length = options.lease > absl::ZeroDuration()
                                          ? options.lease
                                          : GrantedLease(begun.record());
  Lease lease(key, token, SteadyDeadline(lease_length, sent));
  WriteResult written = WriteResult::Unknown();
  {
    Heartbeater heartbeater(*this, &lease, lease_length, options.lease, sent);
    written = fn(lease);
  }

  ExecuteResult r;
  r.fencing_token = token;
  r.record = begun.record();
  r.snapshot = written.snapshot();
  absl::StatusOr<pb::Record> stored;
  switch (written.kind()) {
    case WriteResult::Kind::kUnknown:
      r.kind = ExecuteResult::Kind::kUnreported;
      r.report_status = absl::AbortedError(
          "fn could not tell whether its write happened; nothing was "
          "reported and the record becomes UNKNOWN when its lease runs out");
      return r;
    case WriteResult::Kind::kSuccess: {
      pb::CompleteRequest request;
      *request.mutable_key() = key;
      request.set_fencing_token(token);
      *request.mutable_result() = written.snapshot();
      absl::StatusOr<pb::CompleteResponse> done = Retried<pb::CompleteResponse>(
          [&](grpc::ClientContext* ctx, pb::CompleteResponse* response) {
            return rpc_->stub->Complete(ctx, request, response);
          },
          nullptr);
      if (done.ok()) {
        stored = done->record();
      } else {
        stored = done.status();
      }
      break;
    }
    case WriteResult::Kind::kRetryableFailure:
    case WriteResult::Kind::kFinalFailure: {
      pb::FailRequest request;
      *request.mutable_key() = key;
      request.set_fencing_token(token);
      *request.mutable_error() = written.snapshot();
      request.set_retryable(written.kind() ==
                            WriteResult::Kind::kRetryableFailure);
      absl::StatusOr<pb::FailResponse> done = Retried<pb::FailResponse>(
          [&](grpc::ClientContext* ctx, pb::FailResponse* response) {
            return rpc_->stub->Fail(ctx, request, response);
          },
          nullptr);
      if (done.ok()) {
        stored = done->record();
      } else {
        stored = done.status();
      }
      break;
    }
  }
  if (!stored.ok()) {
    r.report_status = stored.status();
    r.kind = Refused(stored.status().code()) ? ExecuteResult::Kind::kLeaseLost
                                             : ExecuteResult::Kind::kUnreported;
    return r;
  }
  r.record = *std::move(stored);
  r.kind = written.kind() == WriteResult::Kind::kSuccess
               ? ExecuteResult::Kind::kSucceeded
               : ExecuteResult::Kind::kFailed;
  r.snapshot = r.record.result();
  r.retryable = r.record.retryable();
  return r;
}

}  // namespace idem
