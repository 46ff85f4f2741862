#include "server/postgres/migrate.h"

#include <pqxx/pqxx>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "server/postgres/pg_pool.h"

namespace idem {
namespace {

// Any fixed number; the same one in every instance.
constexpr int64_t kMigrationLockId = 0x1de3907e5c;

}  // namespace

absl::StatusOr<std::vector<std::string>> Migrate(const std::string& conninfo) {
  std::vector<std::string> applied;
  try {
    pqxx::connection c(TunedConnInfo(conninfo, absl::Seconds(5)));
    pqxx::nontransaction(c).exec(
        absl::StrCat("SELECT pg_advisory_lock(", kMigrationLockId, ")"));
    {
      pqxx::work tx(c);
      tx.exec(
          "CREATE TABLE IF NOT EXISTS idempotency_schema_migrations ("
          " version integer PRIMARY KEY, name text NOT NULL,"
          " applied_at timestamptz NOT NULL DEFAULT now())");
      tx.commit();
    }
    for (const Migration& m : Migrations()) {
      pqxx::work tx(c);
      pqxx::result done = tx.exec_params(
          "SELECT 1 FROM idempotency_schema_migrations WHERE version = $1",
          m.version);
      if (!done.empty()) continue;
      tx.exec(m.sql);
      tx.exec_params(
          "INSERT INTO idempotency_schema_migrations (version, name)"
          " VALUES ($1, $2)",
          m.version, m.name);
      tx.commit();
      applied.push_back(m.name);
    }
    pqxx::nontransaction(c).exec(
        absl::StrCat("SELECT pg_advisory_unlock(", kMigrationLockId, ")"));
  } catch (...) {
    return StatusFromCurrentException("migrate");
  }
  return applied;
}

}  // namespace idem
