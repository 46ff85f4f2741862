// Schema migrations: the ordered files of sql/, compiled into the binary and
// recorded in idempotency_schema_migrations.
#ifndef IDEM_SERVER_POSTGRES_MIGRATE_H_
#define IDEM_SERVER_POSTGRES_MIGRATE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace idem {

struct Migration {
  int version;       // from the file name's leading number
  std::string name;  // the file name, e.g. "0001_records.sql"
  std::string sql;
};

// The migrations compiled into this binary, in version order.
const std::vector<Migration>& Migrations();

// Applies the pending migrations, each in its own transaction, under a
// PostgreSQL advisory lock so that many instances may start at once. Returns
// the names applied (empty when the schema was up to date). UNAVAILABLE when
// the database cannot be reached. The lock is a session's: `conninfo` names
// PostgreSQL itself, never a transaction-pooling PgBouncer.
absl::StatusOr<std::vector<std::string>> Migrate(const std::string& conninfo);

}  // namespace idem

#endif  // IDEM_SERVER_POSTGRES_MIGRATE_H_
