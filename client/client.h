// idem::Client: a C++ client of the idempotency sidecar (docs/spec.md#api)
// that hides stubs, deadlines, metadata and retries.
//
// Execute() wraps one business write:
//
//   idem::ClientOptions options;
//   options.target = "127.0.0.1:50051";
//   options.tenant = "shop";
//   absl::StatusOr<std::unique_ptr<idem::Client>> client =
//       idem::Client::Create(options);
//   if (!client.ok()) return client.status();
//
//   absl::StatusOr<idem::ExecuteResult> r = (*client)->Execute(
//       {"create-payment", request.idempotency_key()},
//       idem::Fingerprint(CanonicalBytes(request)),
//       [&](const idem::Lease& lease) {
//         // Write, storing lease.fencing_token() with the business row.
//         return idem::WriteResult::Success(idem::MakeSnapshot(201, body));
//       });
//   if (!r.ok()) return r.status();  // fn did not run; retry later
//   switch (r->kind) { ... }         // see ExecuteResult::Kind
//
// Thread safety: a Client is thread-safe; share one per process (it holds
// one gRPC channel). A Lease is thread-safe. The option and result structs
// are plain values.
#ifndef IDEM_CLIENT_CLIENT_H_
#define IDEM_CLIENT_CLIENT_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "idempotency/v1/idempotency.pb.h"

namespace grpc {
class Channel;
}  // namespace grpc

namespace idem {

namespace pb = ::idempotency::v1;

// Returns the SHA-256 (32 bytes) of `canonical_request`, the caller's
// normalised request (e.g. method, path and the JSON body with sorted keys):
// pass it as Execute's request_hash.
std::string Fingerprint(absl::string_view canonical_request);

// Returns the SHA-256 of `fields`, each framed by its length (8 bytes, big
// endian) so that {"ab", "c"} and {"a", "bc"} differ.
std::string FingerprintFields(std::initializer_list<absl::string_view> fields);

// Returns a snapshot with `code`, `body` and `content_type`.
pb::Snapshot MakeSnapshot(int32_t code, absl::string_view body,
                          absl::string_view content_type = "");

// Retries of calls that may succeed when repeated (UNAVAILABLE and
// DEADLINE_EXCEEDED). Each pause is drawn uniformly from [b/2, b], where b
// starts at initial_backoff and is multiplied by `multiplier` after each
// attempt, up to max_backoff.
struct RetryOptions {
  // Attempts per call, the first included; 1 means no retries.
  int max_attempts = 5;
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(2);
  double multiplier = 2.0;
};

struct TlsOptions {
  // Use TLS. Without root_ca_path the system's roots verify the server.
  bool enabled = false;
  // PEM file of the roots that verify the sidecar's certificate.
  std::string root_ca_path;
  // PEM files of this client's certificate chain and private key, for mutual
  // TLS: both or neither.
  std::string cert_chain_path;
  std::string private_key_path;
  // Verify the server's certificate against this name instead of the
  // target's host (tests, IP targets).
  std::string server_name_override;
};

struct ClientOptions {
  // The sidecar's gRPC target, e.g. "127.0.0.1:50051" or
  // "dns:///idem.payments.svc:50051".
  std::string target = "127.0.0.1:50051";
  // The deadline of each RPC (each attempt, when retried).
  absl::Duration deadline = absl::Seconds(5);
  TlsOptions tls;
  // When not empty, sent with every call as "authorization: Bearer <token>".
  std::string bearer_token;
  // The tenant of every key whose tenant is empty.
  std::string tenant;
  RetryOptions retry;
};

// Names a record (docs/spec.md#records). An empty tenant means
// ClientOptions::tenant.
struct RecordId {
  RecordId(std::string operation, std::string key, std::string tenant = "")
      : operation(std::move(operation)),
        key(std::move(key)),
        tenant(std::move(tenant)) {}

  std::string operation;
  std::string key;
  std::string tenant;
};

// What fn says about its write. Build one with the factories.
class WriteResult {
 public:
  enum class Kind {
    kSuccess,           // Complete stores the snapshot.
    kRetryableFailure,  // Fail(retryable): the next Execute runs fn again.
    kFinalFailure,      // Fail(final): the snapshot is replayed from now on.
    kUnknown,           // Neither: the record becomes UNKNOWN (Unknown()).
  };

  // The write happened; `result` is replayed to every later Execute.
  static WriteResult Success(pb::Snapshot result);
  // The write did not happen and may be tried again.
  static WriteResult RetryableFailure(pb::Snapshot error);
  // The write did not happen and must not be tried again; `error` is
  // replayed to every later Execute.
  static WriteResult FinalFailure(pb::Snapshot error);
  // fn cannot tell whether its write happened (e.g. a downstream call timed
  // out). Nothing is reported: the heartbeat stops and the lease runs out,
  // after which the record is UNKNOWN until an operator resolves it.
  static WriteResult Unknown();

  Kind kind() const { return kind_; }
  const pb::Snapshot& snapshot() const { return snapshot_; }

 private:
  WriteResult(Kind kind, pb::Snapshot snapshot)
      : kind_(kind), snapshot_(std::move(snapshot)) {}

  Kind kind_;
  pb::Snapshot snapshot_;
};

// The hold of one Execute on a record while fn runs. Execute owns it; it is
// valid only during the call of fn. Thread-safe: fn may hand it to threads
// that it joins before returning.
class Lease {
 public:
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;

  // The record's key, with the tenant filled in.
  const pb::RecordKey& key() const { return key_; }
  // The fencing token of this attempt: store it with the business write and
  // refuse writes with lower tokens.
  int64_t fencing_token() const { return fencing_token_; }

  // Returns true iff, as far as this client knows, the lease is held: no
  // heartbeat has been refused and the last confirmed expiry (counted
  // conservatively from when the confirming call was sent) has not passed.
  // A long fn should check it between steps and stop when it is false.
  bool alive() const;
  // OK while alive(); otherwise why not: FAILED_PRECONDITION or NOT_FOUND
  // when a heartbeat was refused (the lease expired and the record moved on,
  // or an operator settled it), DEADLINE_EXCEEDED when no heartbeat got
  // through before the lease would have run out.
  absl::Status status() const;

 private:
  friend class Client;

  // Local times are on the steady clock, so that a wall-clock step can
  // neither keep a lease alive nor end it early.
  using Time = std::chrono::steady_clock::time_point;

  Lease(pb::RecordKey key, int64_t fencing_token, Time expires);
  // Records a heartbeat that extended the lease to at least `expires`.
  void Extend(Time expires);
  // Records a refused heartbeat; alive() is false from now on.
  void Lose(const absl::Status& why);

  const pb::RecordKey key_;
  const int64_t fencing_token_;
  mutable absl::Mutex mu_;
  Time expires_ ABSL_GUARDED_BY(mu_);
  absl::Status lost_ ABSL_GUARDED_BY(mu_);
};

// The business write: called at most once per Execute, on the calling
// thread, while Execute keeps the lease alive. It must not throw (if it
// does, the exception propagates after the heartbeat stops, and the record
// is left to become UNKNOWN).
using WriteFn = std::function<WriteResult(const Lease& lease)>;

struct ExecuteOptions {
  // The lease to ask for; zero means the operation's configured lease.
  // Heartbeats extend it every lease/3 while fn runs.
  absl::Duration lease = absl::ZeroDuration();
  // While another attempt holds the lease, call Begin again with backoff
  // (pausing no longer than the sidecar's retry_after) for up to this long;
  // zero answers kInProgress at once.
  absl::Duration wait = absl::ZeroDuration();
};

// What Execute did. Fields not named for a kind are empty.
struct ExecuteResult {
  enum class Kind {
    // The record SUCCEEDED: `snapshot` is the stored result, fn's own
    // (replayed=false) or an earlier attempt's (replayed=true).
    kSucceeded,
    // The record FAILED: `snapshot` is the stored error, fn's own
    // (replayed=false, `retryable` as fn said) or an earlier attempt's
    // (replayed=true, final).
    kFailed,
    // Another attempt holds the lease (still, after options.wait): fn did
    // not run; retry after `retry_after` (409-like).
    kInProgress,
    // An earlier attempt may or may not have written: fn did not run and
    // must not; an operator or the reconciler resolves the record.
    kUnknown,
    // The key was used with another request_hash: fn did not run; reject
    // the request (422-like). `record` carries no snapshot.
    kMismatch,
    // The record outlived its retention and only a tombstone is left: fn
    // did not run and must not; the result is gone (410-like).
    kExpired,
    // fn ran, but the sidecar refused its report (`report_status`,
    // FAILED_PRECONDITION or NOT_FOUND): the lease was lost and the record
    // moved on. `snapshot` is fn's unsaved result; the fencing token guards
    // the business write.
    kLeaseLost,
    // fn ran, but its report is not stored: the sidecar stayed unreachable
    // through the retries or refused the report as invalid
    // (`report_status`), or fn returned WriteResult::Unknown() (ABORTED).
    // The record becomes UNKNOWN when the lease runs out, unless the holder
    // reports later with Complete/Fail and `fencing_token`.
    kUnreported,
  };

  // Returns the name of `kind`, e.g. "SUCCEEDED" for kSucceeded.
  static const char* KindName(Kind kind);

  // Returns true iff fn ran during this Execute.
  bool executed() const { return fencing_token > 0; }

  Kind kind = Kind::kUnknown;
  // True iff `snapshot` was stored by an earlier attempt (fn did not run).
  bool replayed = false;
  pb::Snapshot snapshot;
  bool retryable = false;
  // The token fn ran with; 0 when fn did not run.
  int64_t fencing_token = 0;
  absl::Duration retry_after = absl::ZeroDuration();
  // The record as the sidecar last returned it.
  pb::Record record;
  // Why fn's report was not stored (kLeaseLost, kUnreported).
  absl::Status report_status;
};

class Client {
 public:
  // Connects (lazily) to options.target. INVALID_ARGUMENT for bad options,
  // NOT_FOUND or PERMISSION_DENIED for unreadable TLS files.
  static absl::StatusOr<std::unique_ptr<Client>> Create(
      const ClientOptions& options);
  // Like Create, over `channel` instead of one built from target and tls
  // (e.g. an in-process channel). Pauses between retries then do not watch
  // the channel's reconnection.
  static absl::StatusOr<std::unique_ptr<Client>> CreateWithChannel(
      std::shared_ptr<grpc::Channel> channel, const ClientOptions& options);

  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;
  ~Client();

  // Runs `fn` at most once for the intent named by `id` and fingerprinted by
  // `request_hash` (1-64 bytes):
  //  - Begin with a new attempt id (retried on UNAVAILABLE and
  //    DEADLINE_EXCEEDED: a retry regains a grant the lost answer carried).
  //  - ACQUIRED: runs fn with a Lease, heartbeating every lease/3 on another
  //    thread, then stores fn's answer with Complete or Fail (retried on
  //    UNAVAILABLE and DEADLINE_EXCEEDED; both are idempotent).
  //  - COMPLETED / FAILED: the stored snapshot, replayed.
  //  - IN_PROGRESS: waits up to options.wait (see ExecuteOptions), then
  //    kInProgress. UNKNOWN and MISMATCH: kUnknown and kMismatch.
  // Returns an error only when fn did not run: the status of a Begin that
  // could not be answered (UNAVAILABLE after the retries, INVALID_ARGUMENT
  // naming a bad field, UNAUTHENTICATED...). Once fn has run the result is
  // always OK, its kind saying whether fn's answer was stored.
  absl::StatusOr<ExecuteResult> Execute(
      const RecordId& id, absl::string_view request_hash, const WriteFn& fn,
      const ExecuteOptions& options = ExecuteOptions()) const;

  // The RPCs themselves: exactly one call each, with the deadline and the
  // metadata, and the default tenant filled into an empty key.tenant. The
  // status has the gRPC code and message.
  absl::StatusOr<pb::BeginResponse> Begin(pb::BeginRequest request) const;
  absl::StatusOr<pb::HeartbeatResponse> Heartbeat(
      pb::HeartbeatRequest request) const;
  absl::StatusOr<pb::CompleteResponse> Complete(
      pb::CompleteRequest request) const;
  absl::StatusOr<pb::FailResponse> Fail(pb::FailRequest request) const;
  absl::StatusOr<pb::GetResponse> Get(pb::GetRequest request) const;

  // Returns the key `id` names, with the default tenant filled in.
  pb::RecordKey KeyOf(const RecordId& id) const;

 private:
  struct Rpc;
  class Heartbeater;

  // `own_channel`: the channel was built by Create (so it is a client
  // channel whose connectivity can be watched).
  Client(ClientOptions options, std::shared_ptr<grpc::Channel> channel,
         bool own_channel);

  // Calls `rpc` up to options_.retry.max_attempts times while it fails with
  // UNAVAILABLE or DEADLINE_EXCEEDED; `*sent` is when the first attempt
  // started.
  template <typename Response, typename Call>
  absl::StatusOr<Response> Retried(
      const Call& rpc, std::chrono::steady_clock::time_point* sent) const;
  // Runs fn under the lease on `key` granted by `begun` (whose Begin was
  // first sent at `sent`) and reports its answer.
  ExecuteResult RunHolder(const pb::RecordKey& key,
                          const pb::BeginResponse& begun,
                          std::chrono::steady_clock::time_point sent,
                          const WriteFn& fn,
                          const ExecuteOptions& options) const;

  const ClientOptions options_;
  const std::shared_ptr<grpc::Channel> channel_;
  const bool own_channel_;
  const std::unique_ptr<Rpc> rpc_;
};

}  // namespace idem

#endif  // IDEM_CLIENT_CLIENT_H_
