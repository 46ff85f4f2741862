// The operator console (docs/console.md): a page and a small JSON API over
// the admin operations idemctl uses (List, Get, History, Resolve), with the
// same rules as the gRPC admin service (operators only, tenant scoping, the
// same audit row), and the vital signs of this instance sampled once a
// second. Boost.Beast over one Asio thread of its own; a store call's answer
// is posted back to its connection, so nothing blocks that thread.
#ifndef IDEM_SERVER_CONSOLE_CONSOLE_H_
#define IDEM_SERVER_CONSOLE_CONSOLE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/console/vitals.h"
#include "server/rpc/services.h"

namespace idem::console {

struct ConsoleOptions {
  // host:port or [v6]:port; port 0 picks a free one (port()).
  std::string listen;
};

// Thread-safe. Does not own what `context` points to, which must outlive it.
class Console {
 public:
  // Binds and serves on a thread of its own (thread_names::kConsole).
  // `context` is the admin service's: with context.auth null (no
  // --auth-tokens) every caller is an operator of every tenant, so the
  // address must then be loopback (FAILED_PRECONDITION otherwise, as for
  // the gRPC listener). INVALID_ARGUMENT for a malformed address,
  // UNAVAILABLE when it cannot be bound. `vitals` may be null (the overview
  // then has no figures).
  static absl::StatusOr<std::unique_ptr<Console>> Start(ConsoleOptions options,
                                                        ServiceContext context,
                                                        Vitals* vitals);
  // Stop().
  ~Console();
  Console(const Console&) = delete;
  Console& operator=(const Console&) = delete;

  int port() const;

  // Stops accepting, closes every connection, waits for the store calls it
  // started and joins the thread. Idempotent.
  void Stop();

 private:
  struct Impl;
  explicit Console(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem::console

#endif  // IDEM_SERVER_CONSOLE_CONSOLE_H_
