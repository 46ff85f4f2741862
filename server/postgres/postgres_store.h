// The PostgreSQL store: the source of truth. Records live in
// idempotency_record (sql/), created with INSERT ... ON CONFLICT DO NOTHING and
// changed by conditional UPDATEs on status and fencing token; time is
// PostgreSQL's clock.
#ifndef IDEM_SERVER_POSTGRES_POSTGRES_STORE_H_
#define IDEM_SERVER_POSTGRES_POSTGRES_STORE_H_

#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "server/postgres/pg_batch.h"
#include "server/postgres/pg_pool.h"
#include "server/store/store.h"

namespace idem {

// Returns a store over a pool of `options.pool_size` connections. Connects
// lazily: a database that is down at start-up makes calls UNAVAILABLE until
// it is back. Concurrent reads, inserts and guarded updates are folded into
// batch statements (pg_batch.h) as `batch` allows; a call alone runs the
// single-row statement at once. `pool_in_use`, when not null, is set to
// a thread-safe reader of the pool's connections handed out now
// (idem_pg_connections_in_use), valid as long as the store.
std::unique_ptr<Store> NewPostgresStore(
    const PgOptions& options, const PgBatchOptions& batch = {},
    std::function<int()>* pool_in_use = nullptr);

}  // namespace idem

#endif  // IDEM_SERVER_POSTGRES_POSTGRES_STORE_H_
