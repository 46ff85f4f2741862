// How a Reconciler service is dialled, shared by the sidecar's reconcile
// loop (server/core/reconciler.cc) and `idemctl reconcile --dry-run`, so
// that a preview connects exactly as the sidecar would.
#ifndef IDEM_SERVER_CORE_PROBE_DIAL_H_
#define IDEM_SERVER_CORE_PROBE_DIAL_H_

#include <grpcpp/grpcpp.h>

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "statemachine/record.h"

namespace idem {

struct ProbeDial {
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  grpc::ChannelArguments args;
  // The TLS files' contents: a caller that keeps channels makes a new one
  // when they change.
  std::string pem;
};

// Credentials as `tls` says (its files read now; FAILED_PRECONDITION
// naming `probe_tls.<file>` when one cannot be read), and a receive limit
// as large as the answers the sidecar accepts (`max_snapshot_bytes`).
absl::StatusOr<ProbeDial> PrepareProbeDial(const ProbeTls& tls,
                                           size_t max_snapshot_bytes);

}  // namespace idem

#endif  // IDEM_SERVER_CORE_PROBE_DIAL_H_
