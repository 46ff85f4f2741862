// The sidecar's configuration as given: flags, their IDEM_* environment
// twins and the secrets' environment variables, before validation
// (config_validation.h) and before any file is read (sidecar_resources.h).
#ifndef IDEM_SERVER_MAIN_SIDECAR_CONFIG_H_
#define IDEM_SERVER_MAIN_SIDECAR_CONFIG_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "server/main/flag_groups.h"

namespace idem {

// A plain value: the defaults below are the flags' defaults.
struct SidecarConfig {
  std::string listen = "127.0.0.1:50051";
  PostgresFlags postgres;
  std::string pg_prepared = "on";
  std::string pg_lone_lane = "on";
  int pg_pool_size = 16;
  int pg_max_batch = 64;
  int local_cache_mib = 32;
  int pg_batch_inflight = 1;
  std::string pg_connect_timeout = "2s";
  std::string pg_statement_timeout = "5s";
  std::string metrics_listen = "127.0.0.1:9464";
  // The --config YAML file: policies, and the gateway's routes.
  std::string config;
  bool migrate = false;
  std::string store = "postgres";
  bool insecure = false;
  TlsKeyPairFlags tls;
  std::string tls_client_ca;
  std::string auth_tokens;
  double tenant_rate = 0;
  double tenant_burst = 0;
  int64_t max_processing_per_tenant = 0;
  int max_concurrent_streams = 1000;
  int rpc_threads = 0;
  int max_waiters = 16384;
  int max_waiters_per_tenant = 4096;
  int max_waiters_per_key = 2048;
  int64_t max_calls_in_flight = 20000;
  int64_t max_admin_calls_in_flight = 64;
  int max_health_watches = 64;
  std::string log_level = "info";
  size_t max_snapshot_bytes = 256 * 1024;
  std::string grace_period = "10s";
  std::string drain_delay = "0s";
  std::string reaper_interval = "1s";
  std::string purge_interval = "60s";
  std::string reconcile_interval = "5s";
  int maintenance_batch = 500;
  std::string redis;
  std::string redis_user;
  std::string redis_password_file;
  std::string redis_mac_key_file;
  std::string redis_mac_previous_key_file;
  std::string redis_timeout = "5ms";
  int redis_pool_size = 32;
  std::string redis_backoff_min = "100ms";
  std::string redis_backoff_max = "1s";
  std::string http_listen;
  std::string http_upstream;
  std::string http_tenant = "http";
  int http_threads = 1;
  int http_max_connections = 4096;
  size_t http_max_body = 1 << 20;
  std::string http_upstream_timeout = "30s";
  std::string http_idle_timeout = "60s";
  int http_upstream_keepalive = 32;
  std::string http_upstream_keepalive_timeout = "1s";
  std::string console_listen;
  // Secrets never come as flags (they would show in ps): these are
  // IDEM_REDIS_PASSWORD, IDEM_REDIS_MAC_KEY and IDEM_REDIS_MAC_PREVIOUS_KEY,
  // the alternatives to the --redis-*-file flags.
  std::string redis_password_env;
  std::string redis_mac_key_env;
  std::string redis_mac_previous_key_env;
};

}  // namespace idem

#endif  // IDEM_SERVER_MAIN_SIDECAR_CONFIG_H_
