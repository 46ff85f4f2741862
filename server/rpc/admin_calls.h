// The admin calls' work once the caller is known and allowed, whatever
// carries them: the gRPC admin service and the operator console share it,
// so that a Resolve writes, counts and logs alike and a page of List or
// History is cut and continued alike from either.
#ifndef IDEM_SERVER_RPC_ADMIN_CALLS_H_
#define IDEM_SERVER_RPC_ADMIN_CALLS_H_

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "idempotency/v1/idempotency.pb.h"
#include "server/rpc/services.h"

namespace idem {

// Each fills `*resp`, which must live until `done`, and answers through
// `done` exactly once, from any thread (as Calls and AdminStore do).
using AdminDone = std::function<void(absl::Status)>;

// Resolves `key` as `cmd` says; with auth on, `caller` is the actor the
// audit row names, whatever the request said. Counted and logged (with
// `via` when not null).
void ResolveRecord(const ServiceContext& c, const RecordKey& key,
                   ResolveCommand cmd, const std::string& caller,
                   const char* via, pb::ResolveResponse* resp, AdminDone done);

// One page of `query`'s audit entries, and the token of the next.
void HistoryPage(const ServiceContext& c, const HistoryQuery& query,
                 pb::HistoryResponse* resp, AdminDone done);

// One page of the records `query` matches, continuing after `page_token`
// (empty: from the start), cut to kMaxListPageBytes encoded (the first
// record always, so that paging moves on), and the token of the next.
void ListPage(const ServiceContext& c, ListQuery query,
              const std::string& page_token, pb::ListResponse* resp,
              AdminDone done);

}  // namespace idem

#endif  // IDEM_SERVER_RPC_ADMIN_CALLS_H_
