// The start-up's steps beside the parts: migrations, before anything
// starts, and the "serving" line, once everything has.
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/base/log.h"
#include "server/main/assembly.h"
#include "server/postgres/migrate.h"

namespace idem {

absl::Status RunMigrations(const std::string& conninfo) {
  if (conninfo.empty()) {
    return absl::InvalidArgumentError("--postgres: required for migrations");
  }
  std::vector<std::string> distributed;
  absl::StatusOr<std::vector<std::string>> applied =
      Migrate(conninfo, &distributed);
  if (!applied.ok()) {
    return absl::Status(
        applied.status().code(),
        absl::StrCat("migrate failed: ", applied.status().ToString()));
  }
  Log(LogLevel::kInfo, "migrations applied",
      {{"applied", applied->empty() ? "none (schema up to date)"
                                    : absl::StrJoin(*applied, ",")}});
  if (!distributed.empty()) {
    Log(LogLevel::kInfo, "Citus: tables distributed by tenant_id",
        {{"tables", absl::StrJoin(distributed, ",")}});
  }
  return absl::OkStatus();
}

void Sidecar::LogServing() const {
  const SidecarConfig& c = options_.config;
  if (options_.http) {
    Log(LogLevel::kInfo, "HTTP gateway serving",
        {{"http_listen", c.http_listen},
         {"http_upstream", c.http_upstream},
         {"tenant", c.http_tenant},
         {"routes", absl::StrCat(resources_.routes.routes.size())}});
  }
  const std::string tls = !options_.tls ? "off"
                          : c.tls_client_ca.empty()
                              ? "on"
                              : "mutual (client certificates required)";
  const std::string auth =
      resources_.auth     ? (c.tls_client_ca.empty()
                                 ? "bearer tokens (" + c.auth_tokens + ")"
                                 : "bearer tokens and client certificates (" +
                                   c.auth_tokens + ")")
      : options_.loopback ? "off (loopback only)"
                          : "off (--insecure: every caller is an operator "
                            "of every tenant)";
  Log(LogLevel::kInfo, "serving",
      {{"listen", c.listen},
       {"metrics_listen", exposer_ ? c.metrics_listen : "off"},
       {"store", c.store},
       {"redis", c.redis.empty() ? "off" : c.redis},
       {"tls", tls},
       {"auth", auth},
       {"tenant_rate",
        c.tenant_rate > 0 ? absl::StrCat(c.tenant_rate, "/s") : "off"}});
}

}  // namespace idem
