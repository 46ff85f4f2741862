// The rules a SidecarConfig must meet before anything starts, and the typed
// options they yield. Pure: reads no file and no environment, so each rule
// has a unit test (config_validation_test.cc).
#ifndef IDEM_SERVER_MAIN_CONFIG_VALIDATION_H_
#define IDEM_SERVER_MAIN_CONFIG_VALIDATION_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/base/log.h"
#include "server/cache/redis_client.h"
#include "server/core/maintenance.h"
#include "server/core/reconciler.h"
#include "server/gateway/gateway.h"
#include "server/main/sidecar_config.h"
#include "server/postgres/pg_batch.h"
#include "server/postgres/pg_pool.h"

namespace idem {

// No duration flag may be longer: "inf" or 9999999h would overflow the
// deadlines and PostgreSQL settings computed from them (statement_timeout
// is an int of milliseconds), and none needs more than a day.
inline constexpr absl::Duration kMaxFlagDuration = absl::Hours(24);

// A valid configuration: the flags as given, and what they mean to the
// parts that take typed options.
struct SidecarOptions {
  SidecarConfig config;
  LogLevel log_level = LogLevel::kInfo;
  PgOptions pg;
  PgBatchOptions batch;
  absl::Duration grace_period;
  absl::Duration drain_delay;
  MaintenanceOptions maintenance;
  ReconcilerOptions reconcile;
  // Set with --redis; its password is read later (sidecar_resources.h).
  std::optional<RedisOptions> redis;
  // Set with --http-listen.
  std::optional<gateway::GatewayOptions> http;
  // --tls-cert or --tls-key is set.
  bool tls = false;
  // --listen is loopback-only (or a unix socket).
  bool loopback = false;
};

// Whether `listen` (host:port, [v6]:port or unix:path) is loopback-only.
bool IsLoopback(const std::string& listen);

// The duration in `value` of --`flag`: INVALID_ARGUMENT naming the flag
// unless it lies within (0, kMaxFlagDuration] ([0, ...] for drain-delay).
absl::StatusOr<absl::Duration> ParseFlagDuration(const std::string& flag,
                                                 const std::string& value);

// Checks every rule on `config` (ranges, flags that need one another, a
// non-loopback --listen that identifies nobody) and returns the typed
// options. INVALID_ARGUMENT, its message naming the flag, on the first rule
// broken, in the order the sidecar has always checked them.
absl::StatusOr<SidecarOptions> Validate(const SidecarConfig& config);

}  // namespace idem

#endif  // IDEM_SERVER_MAIN_CONFIG_VALIDATION_H_
