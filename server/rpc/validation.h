// Input validation for the public API (docs/spec.md#validation). Each Parse*
// function checks one request and converts it; a bad field is
// INVALID_ARGUMENT whose message starts with the field's name.
#ifndef IDEM_SERVER_RPC_VALIDATION_H_
#define IDEM_SERVER_RPC_VALIDATION_H_

#include <cstddef>

#include "absl/status/statusor.h"
#include "idempotency/v1/idempotency.pb.h"
#include "server/base/config.h"
#include "server/store/store.h"
#include "statemachine/transitions.h"

namespace idem {

struct Limits {
  // Body, content type and headers of one snapshot together.
  size_t max_snapshot_bytes = 256 * 1024;
};

namespace pb = ::idempotency::v1;

absl::StatusOr<RecordKey> ParseKey(const pb::RecordKey& key, bool present);
absl::StatusOr<BeginCommand> ParseBegin(const pb::BeginRequest& req,
                                        const PolicySet& policies);
absl::StatusOr<HeartbeatCommand> ParseHeartbeat(const pb::HeartbeatRequest& req,
                                                const PolicySet& policies);
absl::StatusOr<CompleteCommand> ParseComplete(const pb::CompleteRequest& req,
                                              const Limits& limits);
absl::StatusOr<FailCommand> ParseFail(const pb::FailRequest& req,
                                      const Limits& limits);
// Page size: 0 means kDefaultPageSize; larger than kMaxPageSize is capped.
inline constexpr int kDefaultPageSize = 100;
inline constexpr int kMaxPageSize = 1000;
// A List answer stays within this many bytes, under the 4 MiB that gRPC
// clients accept by default, with room for gRPC's framing; a page that
// would pass it ends early (docs/spec.md#idemctl). Only a page of one record
// larger than this is larger.
inline constexpr size_t kMaxListPageBytes = (4 << 20) - (64 << 10);
// The filters of a listing (the page token is decoded separately).
absl::StatusOr<ListQuery> ParseList(const pb::ListRequest& req);
// A History page of `key` (parsed by ParseKey): page_size as List's,
// page_token one a History of `key` issued.
absl::StatusOr<HistoryQuery> ParseHistory(const pb::HistoryRequest& req,
                                          const RecordKey& key);
absl::StatusOr<ResolveCommand> ParseResolve(const pb::ResolveRequest& req,
                                            const Limits& limits);

}  // namespace idem

#endif  // IDEM_SERVER_RPC_VALIDATION_H_
