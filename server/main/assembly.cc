#include "server/main/assembly.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>

#include <algorithm>
#include <functional>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/base/log.h"
#include "server/cache/local_cache.h"
#include "server/cache/redis_client.h"
#include "server/cache/redis_store.h"
#include "server/postgres/postgres_store.h"
#include "server/store/instrumented_store.h"
#include "server/store/memory_store.h"

namespace idem {
namespace {

// The operations the config names, which the metrics label apart.
std::set<std::string> OperationsOf(const PolicySet& policies) {
  std::set<std::string> operations;
  for (const auto& [name, policy] : policies.operations()) {
    operations.insert(name);
  }
  return operations;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Sidecar>> Sidecar::Build(
    SidecarOptions options, SidecarResources resources) {
  const SidecarConfig& c = options.config;
  if (c.store == "postgres" && c.migrate) {
    absl::Status s = RunMigrations(
        c.postgres.direct.empty() ? c.postgres.conninfo : c.postgres.direct);
    if (!s.ok()) return s;
  }
  std::unique_ptr<Sidecar> sidecar(
      new Sidecar(std::move(options), std::move(resources)));
  sidecar->BuildCore();
  sidecar->BuildServers();
  sidecar->AddParts();
  return sidecar;
}

Sidecar::Sidecar(SidecarOptions options, SidecarResources resources)
    : options_(std::move(options)),
      resources_(std::move(resources)),
      rate_limiter_(options_.config.tenant_rate, options_.config.tenant_burst),
      metrics_(std::make_unique<Metrics>(OperationsOf(resources_.policies))) {}

Sidecar::~Sidecar() { Stop(); }

void Sidecar::BuildCore() {
  const SidecarConfig& c = options_.config;
  PgStoreProbes probes;
  store_ = c.store == "memory"
               ? NewMemoryStore()
               : NewPostgresStore(options_.pg, options_.batch, &probes);
  if (probes.pool_in_use) {
    metrics_->AddScrapedGauge(
        "idem_pg_connections_in_use",
        "PostgreSQL pool connections handed out to calls now.",
        [f = probes.pool_in_use] { return static_cast<double>(f()); });
    metrics_->AddScrapedCounter(
        "idem_pg_lane_calls_total",
        "Record calls sent to PostgreSQL on the lone-call lane "
        "(--pg-lone-lane) rather than through the batch threads.",
        [f = probes.lane_calls] { return static_cast<double>(f()); });
  }
  store_ = NewInstrumentedStore(std::move(store_), c.store, metrics_.get());
  records_ = store_.get();
  if (options_.redis) {
    Metrics* metrics = metrics_.get();
    metrics->SetRedisUp(false);
    redis_cache_ = NewRedisCacheStore(
        records_,
        NewRedisClient(*options_.redis,
                       [metrics](bool up) { metrics->SetRedisUp(up); }),
        resources_.cache_mac, metrics);
    records_ = redis_cache_.get();
  }
  if (c.store == "postgres") {
    LocalCacheOptions local;
    local.max_bytes = static_cast<size_t>(c.local_cache_mib) << 20;
    local_cache_ = NewLocalCacheStore(records_, local);
    if (local_cache_ != nullptr) records_ = local_cache_.get();
  }
  CallsOptions calls_options;
  calls_options.coordinator.max_processing_per_tenant =
      c.max_processing_per_tenant;
  calls_options.waiters = WaiterLimits{c.max_waiters_per_key,
                                       c.max_waiters_per_tenant, c.max_waiters};
  calls_ =
      std::make_unique<Calls>(records_, store_->Changes(), &resources_.policies,
                              metrics_.get(), calls_options);
  ServiceContext context;
  context.calls = calls_.get();
  context.admin_store = store_.get();
  context.limits.max_snapshot_bytes = c.max_snapshot_bytes;
  context.metrics = metrics_.get();
  context.auth = resources_.auth.get();
  context.rate = rate_limiter_.enabled() ? &rate_limiter_ : nullptr;
  context_ = context;
  service_ = std::make_unique<IdempotencyService>(context);
  admin_ = std::make_unique<IdempotencyAdminService>(
      context, c.max_admin_calls_in_flight);
}

void Sidecar::BuildServers() {
  const SidecarConfig& c = options_.config;
  // Our own health service: gRPC's default one is a callback service, whose
  // threads would read the calls meant for the RPC threads (async_server.h).
  grpc::EnableDefaultHealthCheckService(false);
  health_service_ =
      std::make_unique<HealthService>(c.max_health_watches, metrics_.get());
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  builder_ = std::make_unique<grpc::ServerBuilder>();
  builder_->AddListeningPort(c.listen, resources_.credentials, &port_);
  // gRPC binds with SO_REUSEPORT by default: a second instance started on
  // the same address by mistake would take half of the connections
  // silently. Without it the second one fails to start instead.
  builder_->AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder_->AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                               c.max_concurrent_streams);
  builder_->RegisterService(service_.get());
  builder_->RegisterService(admin_.get());
  builder_->RegisterService(health_service_.get());
  rpcs_ = std::make_unique<AsyncServer>(
      builder_.get(), c.rpc_threads > 0 ? c.rpc_threads : DefaultAsyncThreads(),
      c.max_calls_in_flight, metrics_.get());
  service_->ServeOn(rpcs_.get());
  admin_->ServeOn(rpcs_.get());
  health_service_->ServeOn(rpcs_.get());
  metrics_->AddScrapedGauge(
      "idem_calls_in_flight",
      "Idempotency calls taken and not yet answered, parked ones included.",
      [in_flight = rpcs_->in_flight()] {
        return static_cast<double>(in_flight->load());
      });
  builder_->SetMaxReceiveMessageSize(
      static_cast<int>(std::max<size_t>(4 << 20, c.max_snapshot_bytes * 2)));
  // Threads of the one synchronous service, reflection (grpcurl's
  // discovery): every other call is served by the RPC threads.
  quota_.SetMaxThreads(16);
  builder_->SetResourceQuota(quota_);
}

void Sidecar::AddParts() {
  const SidecarConfig& c = options_.config;
  if (!c.metrics_listen.empty() && c.metrics_listen != "off") {
    parts_.Add(
        "metrics",
        [this, &c]() -> absl::Status {
          absl::StatusOr<std::unique_ptr<prometheus::Exposer>> served =
              ServeMetrics(c.metrics_listen, *metrics_);
          if (!served.ok()) return served.status();
          exposer_ = *std::move(served);
          return absl::OkStatus();
        },
        [this] { exposer_.reset(); });
  }
  parts_.Add(
      "maintenance",
      [this]() -> absl::Status {
        Metrics* metrics = metrics_.get();
        MaintenanceHooks hooks;
        hooks.expired = [metrics](const Record& r) {
          metrics->LeaseExpired(r.key.operation, r.status == Status::kUnknown
                                                     ? ExpiryPolicy::kUnknown
                                                     : ExpiryPolicy::kRelease);
        };
        hooks.stats = [metrics](const StoreStats& s) {
          metrics->SetRecordCounts(s.records, s.oldest_unknown_age);
        };
        // The caches drop what the purge removed.
        hooks.purged = [records =
                            records_](const std::vector<RecordKey>& keys) {
          records->Forget(keys);
        };
        maintenance_ = std::make_unique<Maintenance>(
            store_.get(), &resources_.policies, options_.maintenance, hooks);
        return absl::OkStatus();
      },
      [this] { maintenance_.reset(); });
  parts_.Add(
      "reconciler",
      [this]() -> absl::Status {
        reconciler_ = std::make_unique<Reconciler>(
            store_.get(), calls_->coordinator(), &resources_.policies,
            metrics_.get(), options_.reconcile);
        reconciler_->Start();
        return absl::OkStatus();
      },
      [this] { reconciler_.reset(); });
  parts_.Add(
      "grpc",
      [this, &c]() -> absl::Status {
        server_ = builder_->BuildAndStart();
        if (server_ == nullptr || port_ == 0) {
          return absl::UnavailableError(
              absl::StrCat("cannot listen on ", c.listen,
                           " (in use by another process, or not an address "
                           "of this host)"));
        }
        rpcs_->Start();
        return absl::OkStatus();
      },
      [this] {
        server_->Shutdown(std::chrono::system_clock::now() +
                          absl::ToChronoNanoseconds(options_.grace_period));
        server_->Wait();
        rpcs_->Stop();
      });
  if (options_.http) {
    parts_.Add(
        "gateway",
        [this]() -> absl::Status {
          absl::StatusOr<std::unique_ptr<gateway::Gateway>> started =
              gateway::Gateway::Start(*options_.http, resources_.routes,
                                      calls_.get(), metrics_.get());
          if (!started.ok()) return started.status();
          gateway_ = *std::move(started);
          metrics_->AddScrapedGauge(
              "idem_http_connections",
              "HTTP gateway client connections open now.",
              [g = gateway_.get()] {
                return static_cast<double>(g->connections());
              });
          return absl::OkStatus();
        },
        [this] { gateway_->Stop(options_.grace_period); });
  }
  if (!c.console_listen.empty()) {
    // A sampler and a listener of its own: nothing on the call path.
    parts_.Add(
        "console",
        [this, &c]() -> absl::Status {
          vitals_ = std::make_unique<console::Vitals>(
              std::vector<std::shared_ptr<prometheus::Collectable>>{
                  metrics_->registry(), metrics_->scraped()});
          absl::StatusOr<std::unique_ptr<console::Console>> started =
              console::Console::Start({c.console_listen}, context_,
                                      vitals_.get());
          if (!started.ok()) return started.status();
          console_ = *std::move(started);
          Log(LogLevel::kInfo, "console serving",
              {{"console_listen", c.console_listen}});
          return absl::OkStatus();
        },
        [this] {
          console_->Stop();
          vitals_.reset();
        });
  }
  parts_.Add(
      "serving",
      [this]() -> absl::Status {
        health_ = std::make_unique<HealthMonitor>(
            store_.get(), health_service_.get(), absl::Seconds(1));
        return absl::OkStatus();
      },
      [this] {
        health_->Stop();
        // Still serving while load balancers and probes notice NOT_SERVING.
        absl::SleepFor(options_.drain_delay);
        // Open health Watch streams end now rather than at the deadline, and
        // so do parked Begins (answered IN_PROGRESS, as at the end of their
        // wait).
        health_service_->Shutdown();
        calls_->Shutdown();
      });
}

absl::Status Sidecar::Start() {
  absl::Status s = parts_.Start();
  if (s.ok()) LogServing();
  return s;
}

void Sidecar::Stop() { parts_.Stop(); }

}  // namespace idem
