// Schema migrations: the ordered files of sql/, compiled into the binary and
// recorded in idempotency_schema_migrations.
#ifndef IDEM_SERVER_POSTGRES_MIGRATE_H_
#define IDEM_SERVER_POSTGRES_MIGRATE_H_

#include <pqxx/pqxx>
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
// PostgreSQL itself (on Citus, the coordinator), never a
// transaction-pooling PgBouncer.
//
// When the database has the `citus` extension, the record and audit tables
// are then distributed by tenant_id, co-located, unless they already are
// (docs/decisions/0027-citus-store.md); `*distributed` (when given) gets
// the tables this call distributed. On plain PostgreSQL nothing more runs.
absl::StatusOr<std::vector<std::string>> Migrate(
    const std::string& conninfo,
    std::vector<std::string>* distributed = nullptr);

// Whether the record table is a Citus distributed table in the database
// `c` is connected to.
bool IsDistributed(pqxx::connection& c);

}  // namespace idem

#endif  // IDEM_SERVER_POSTGRES_MIGRATE_H_
