// The reconcile loop (docs/spec.md): UNKNOWN records of operations whose policy
// names a probe are asked about, via the business service's
// idempotency.v1.Reconciler.Probe: APPLIED settles them SUCCEEDED with the
// returned snapshot, NOT_APPLIED settles them FAILED retryable (the client's
// retry may then run), INDETERMINATE or an error tries again later with
// backoff and, after the operation's reconcile_attempts, leaves the record
// to an operator. An answer whose snapshot or detail fails the checks a
// Complete or Resolve would fail settles nothing either: it counts as an
// invalid verdict. The probe's channel uses TLS when the operation's
// probe_tls says so. Settling is an audited Resolve (actor "reconciler")
// guarded by the record's fencing token, so instances racing on one record, or
// an operator resolving it meanwhile, cannot be overwritten.
#ifndef IDEM_SERVER_CORE_RECONCILER_H_
#define IDEM_SERVER_CORE_RECONCILER_H_

#include <grpcpp/grpcpp.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/steady_wait.h"
#include "server/base/config.h"
#include "server/base/log.h"
#include "server/core/coordinator.h"
#include "server/core/core_metrics.h"
#include "server/store/store.h"

namespace idem {

struct ReconcilerOptions {
  absl::Duration interval = absl::Seconds(5);
  absl::Duration probe_timeout = absl::Seconds(2);
  // Backoff between probes of one record starts at `interval`, doubles per
  // attempt, and stops growing here.
  absl::Duration max_backoff = absl::Minutes(5);
  int batch_size = 50;
  // --max-snapshot-bytes: an APPLIED result larger than this is refused,
  // and the probe's channel accepts answers as large as the sidecar's port.
  size_t max_snapshot_bytes = 256 * 1024;
};

// Thread-safe. Does not own its arguments; `metrics` may be null.
class Reconciler {
 public:
  Reconciler(MaintenanceStore* store, Coordinator* coordinator,
             const PolicySet* policies, CoreMetrics* metrics,
             ReconcilerOptions options);
  ~Reconciler();
  Reconciler(const Reconciler&) = delete;
  Reconciler& operator=(const Reconciler&) = delete;

  // Runs every `interval` on a background thread until destroyed (nothing
  // to do when no operation has a probe).
  void Start();

  // One pass: claims due records and probes them. Returns how many were
  // settled.
  absl::StatusOr<int> RunOnce();

 private:
  // Probes and settles one claimed record; true if it was settled.
  bool Reconcile(const ReconcileClaim& claim, const Policy& policy);
  // The channel to the policy's probe, with its TLS files read now: a
  // changed file gets a new channel. An error when a file cannot be read.
  absl::StatusOr<std::shared_ptr<grpc::Channel>> ChannelFor(
      const Policy& policy);

  MaintenanceStore* const store_;
  Coordinator* const coordinator_;
  const PolicySet* const policies_;
  CoreMetrics* const metrics_;
  const ReconcilerOptions options_;
  std::map<std::string, int> max_attempts_;  // operations with a probe

  struct ProbeChannel {
    std::string pem;  // the TLS files' contents it was made with
    std::shared_ptr<grpc::Channel> channel;
  };

  absl::Mutex mu_;
  // By address and TLS settings.
  std::map<std::string, ProbeChannel> channels_ ABSL_GUARDED_BY(mu_);
  // Invalid answers are logged at warn at most once a second, so that a
  // service answering nonsense for every record cannot flood the log (each
  // one is counted).
  OncePerSecond invalid_log_;
  SteadyNotification stop_;
  std::thread thread_;
};

}  // namespace idem

#endif  // IDEM_SERVER_CORE_RECONCILER_H_
