#include "server/postgres/migrate.h"

#include <pqxx/pqxx>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "server/postgres/pg_pool.h"

namespace idem {
namespace {

// Any fixed number; the same one in every instance.
constexpr int64_t kMigrationLockId = 0x1de3907e5c;

bool HasCitus(pqxx::connection& c) {
  return pqxx::nontransaction(c)
      .exec1(
          "SELECT EXISTS (SELECT 1 FROM pg_extension"
          " WHERE extname = 'citus')")[0]
      .as<bool>();
}

bool IsDistributedTable(pqxx::connection& c, const std::string& table) {
  return pqxx::nontransaction(c)
      .exec_params1(
          "SELECT EXISTS (SELECT 1 FROM pg_dist_partition"
          " WHERE logicalrelid = $1::regclass)",
          table)[0]
      .as<bool>();
}

// Distributes the two tables by tenant_id, the audit co-located with the
// records so that a settle and its audit row are one shard's statement.
// The NOTIFY trigger goes first: on a shard it would notify on a worker,
// where no sidecar listens, and a NOTIFY makes Citus refuse the two-phase
// commit of a transaction that writes on two workers; the store notifies
// on the coordinator instead (decision 27). Each step is skipped when done.
void Distribute(pqxx::connection& c, std::vector<std::string>* distributed) {
  {
    pqxx::work tx(c);
    const bool trigger = tx.exec1(
                               "SELECT EXISTS (SELECT 1 FROM pg_trigger"
                               " WHERE tgrelid = 'idempotency_record'::regclass"
                               " AND tgname = 'idempotency_record_notify')")[0]
                             .as<bool>();
    if (trigger) {
      // Tables distributed by hand kept it on every shard; Citus lets it be
      // dropped there only with this setting.
      tx.exec0("SET LOCAL citus.enable_unsafe_triggers = on");
      tx.exec0("DROP TRIGGER idempotency_record_notify ON idempotency_record");
    }
    tx.commit();
  }
  for (const auto& [table, colocate] :
       std::vector<std::pair<std::string, std::string>>{
           {"idempotency_record", "default"},
           {"idempotency_audit", "idempotency_record"}}) {
    if (IsDistributedTable(c, table)) continue;
    pqxx::nontransaction(c).exec_params(
        "SELECT create_distributed_table($1::regclass, 'tenant_id',"
        " colocate_with => $2)",
        table, colocate);
    if (distributed != nullptr) distributed->push_back(table);
  }
}

}  // namespace

bool IsDistributed(pqxx::connection& c) {
  return HasCitus(c) && IsDistributedTable(c, "idempotency_record");
}

absl::StatusOr<std::vector<std::string>> Migrate(
    const std::string& conninfo, std::vector<std::string>* distributed) {
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
    if (HasCitus(c)) Distribute(c, distributed);
    pqxx::nontransaction(c).exec(
        absl::StrCat("SELECT pg_advisory_unlock(", kMigrationLockId, ")"));
  } catch (...) {
    return StatusFromCurrentException("migrate");
  }
  return applied;
}

}  // namespace idem
