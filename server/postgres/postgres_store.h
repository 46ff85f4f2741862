// The PostgreSQL store: the source of truth. Records live in
// idempotency_record (sql/), created with INSERT ... ON CONFLICT DO NOTHING and
// changed by conditional UPDATEs on status and fencing token; time is
// PostgreSQL's clock.
#ifndef IDEM_SERVER_POSTGRES_POSTGRES_STORE_H_
#define IDEM_SERVER_POSTGRES_POSTGRES_STORE_H_

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "server/postgres/pg_batch.h"
#include "server/postgres/pg_pool.h"
#include "server/store/store.h"

namespace idem {

// Readers of the PostgreSQL store's figures, thread-safe and valid as long as
// the store.
struct PgStoreProbes {
  // The pool's connections handed out now (idem_pg_connections_in_use).
  std::function<int()> pool_in_use;
  // Record calls sent on the lone-call lane so far (idem_pg_lane_calls_total;
  // 0 with the lane off).
  std::function<uint64_t()> lane_calls;
};

// Returns a store over a pool of `options.pool_size` connections. Connects
// lazily: a database that is down at start-up makes calls UNAVAILABLE until
// it is back. Concurrent reads, inserts and guarded updates are folded into
// batch statements (pg_batch.h) as `batch` allows; a call alone runs the
// single-row statement at once, on the lone-call lane (pg_lane.h) when
// `batch.lone_lane`. `probes`, when not null, is filled with readers of
// the store's figures.
std::unique_ptr<Store> NewPostgresStore(const PgOptions& options,
                                        const PgBatchOptions& batch = {},
                                        PgStoreProbes* probes = nullptr);

}  // namespace idem

#endif  // IDEM_SERVER_POSTGRES_POSTGRES_STORE_H_
