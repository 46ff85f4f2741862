// idempotency-sidecar: the gRPC server (docs/spec.md#product, #storage).
//
//   idempotency-sidecar [flags]                  serve
//   idempotency-sidecar --migrate [flags]        apply migrations, then serve
//   idempotency-sidecar migrate --postgres=DSN   apply migrations and exit
//
// Every flag has an IDEM_* environment twin (--pg-pool-size:
// IDEM_PG_POOL_SIZE). The Redis password and the keys of the Redis cache's
// MAC are never flags (they would show in ps): they come from
// --redis-password-file or IDEM_REDIS_PASSWORD, --redis-mac-key-file or
// IDEM_REDIS_MAC_KEY, --redis-mac-previous-key-file or
// IDEM_REDIS_MAC_PREVIOUS_KEY.
//
// The steps: parse (sidecar_flags.h), validate (config_validation.h), read
// the files the flags name (sidecar_resources.h), build and start the parts
// (assembly.h), wait for a signal, stop them in reverse.
#include <signal.h>

#ifdef IDEM_TCMALLOC
#include <gperftools/malloc_extension.h>
#endif

#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/base/log.h"
#include "server/main/assembly.h"
#include "server/main/config_validation.h"
#include "server/main/sidecar_flags.h"
#include "server/main/sidecar_resources.h"

namespace idem {
namespace {

// The exit code of a configuration or start-up error.
constexpr int kExitConfig = 2;

int Die(const absl::Status& status) {
  Log(LogLevel::kError, std::string(status.message()));
  return kExitConfig;
}

// Logs a warning for each setting that is valid but unsafe or ignored.
void LogConfigWarnings(const SidecarOptions& options) {
  const SidecarConfig& c = options.config;
  if (c.redis.empty() &&
      (!c.redis_user.empty() || !c.redis_password_file.empty() ||
       !c.redis_password_env.empty() || !c.redis_mac_key_file.empty() ||
       !c.redis_mac_key_env.empty())) {
    Log(LogLevel::kWarn,
        "--redis-user, --redis-password-file, IDEM_REDIS_PASSWORD, "
        "--redis-mac-key-file or IDEM_REDIS_MAC_KEY set without --redis: "
        "ignored, no cache");
  }
  if (c.auth_tokens.empty() && !options.loopback) {
    Log(LogLevel::kWarn,
        "--insecure: serving without authentication on a non-loopback "
        "address; anyone who can reach it can read and settle every "
        "tenant's records",
        {{"listen", c.listen}, {"tls", options.tls ? "on" : "off"}});
  }
  if (c.store == "memory") {
    Log(LogLevel::kWarn,
        "--store=memory: records live in this process only. They are lost "
        "on exit and NOT shared with other instances. Never use this in "
        "production or with more than one instance.");
  } else if (!options.pg.prepared && c.postgres.direct.empty()) {
    // Through transaction pooling LISTEN succeeds but hears nothing, and
    // waiting Begins would only learn of outcomes at their deadlines.
    Log(LogLevel::kWarn,
        "--pg-prepared=off without --postgres-direct: LISTEN and "
        "migrations use --postgres, which must then not be a "
        "transaction-pooling PgBouncer");
  }
}

// Blocks until SIGTERM or SIGINT (blocked in every thread by Main).
int WaitForSignal() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  int sig = 0;
  sigwait(&set, &sig);
  return sig;
}

int Serve(const SidecarConfig& config) {
  absl::StatusOr<SidecarOptions> options = Validate(config);
  if (!options.ok()) return Die(options.status());
  SetLogLevel(options->log_level);
  absl::StatusOr<SidecarResources> resources = LoadResources(&*options);
  if (!resources.ok()) return Die(resources.status());
  LogConfigWarnings(*options);
  const absl::Duration grace = options->grace_period;
  absl::StatusOr<std::unique_ptr<Sidecar>> sidecar =
      Sidecar::Build(*std::move(options), *std::move(resources));
  if (!sidecar.ok()) return Die(sidecar.status());
  absl::Status started = (*sidecar)->Start();
  if (!started.ok()) return Die(started);
  int sig = WaitForSignal();
  Log(LogLevel::kInfo, "shutting down",
      {{"signal", absl::StrCat(sig)},
       {"grace_period", absl::FormatDuration(grace)}});
  (*sidecar)->Stop();
  Log(LogLevel::kInfo, "stopped");
  return 0;
}

int Main(int argc, char** argv) {
  // Signals are taken by WaitForSignal, not by whichever thread gets them.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  // hiredis writes with write(2): a Redis that closed the connection must
  // fail that call, not kill the process.
  signal(SIGPIPE, SIG_IGN);

  CommandLine command_line;
  std::optional<int> exit_code = ParseCommandLine(argc, argv, &command_line);
  if (exit_code) return *exit_code;
  if (command_line.migrate_only) {
    absl::Status s = RunMigrations(command_line.migrate_conninfo);
    return s.ok() ? 0 : Die(s);
  }
  return Serve(command_line.config);
}

}  // namespace
}  // namespace idem

int main(int argc, char** argv) {
  // Debian's Abseil is built with the deadlock detector on: it keeps a
  // global lock-order graph that every absl::Mutex (gRPC's locks too)
  // updates, which costs more CPU than the locks themselves.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
#ifdef IDEM_TCMALLOC
  // tcmalloc lets its per-thread caches hold 32 MiB in all; a quarter of
  // that is as fast on replays and lowers peak RSS: less freed memory sits
  // idle in the threads' caches.
  if (!MallocExtension::instance()->SetNumericProperty(
          "tcmalloc.max_total_thread_cache_bytes", 8 << 20)) {
    idem::Log(idem::LogLevel::kWarn,
              "tcmalloc refused the 8 MiB thread cache cap; using its default");
  }
#endif
  return idem::Main(argc, argv);
}
