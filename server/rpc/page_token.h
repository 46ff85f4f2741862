// Opaque page tokens for IdempotencyAdmin.List and History: where a listing
// continues, bound to the filters (or the record) it was made for.
#ifndef IDEM_SERVER_RPC_PAGE_TOKEN_H_
#define IDEM_SERVER_RPC_PAGE_TOKEN_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "server/store/store.h"

namespace idem {

// The most a token takes in a ListResponse: one made of the longest
// tenant, operation and key validation allows is about 1.1 KiB.
inline constexpr size_t kMaxPageTokenBytes = 2048;

// Returns a token continuing `query` after `after`.
std::string EncodePageToken(const ListQuery& query, const ListCursor& after);

// Returns the cursor in `token`; INVALID_ARGUMENT ("page_token: ...") when it
// is malformed or was made for other filters.
absl::StatusOr<ListCursor> DecodePageToken(const std::string& token,
                                           const ListQuery& query);

// Returns a token continuing the History of `key` after the audit entry
// with id `after_id`.
std::string EncodeHistoryToken(const RecordKey& key, int64_t after_id);

// Returns the audit id in `token`; INVALID_ARGUMENT ("page_token: ...") when
// it is malformed or was made for another record.
absl::StatusOr<int64_t> DecodeHistoryToken(const std::string& token,
                                           const RecordKey& key);

}  // namespace idem

#endif  // IDEM_SERVER_RPC_PAGE_TOKEN_H_
