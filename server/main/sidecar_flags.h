// The sidecar's command line: its flags, their IDEM_* twins and --help,
// parsed into a SidecarConfig in one place.
#ifndef IDEM_SERVER_MAIN_SIDECAR_FLAGS_H_
#define IDEM_SERVER_MAIN_SIDECAR_FLAGS_H_

#include <optional>
#include <string>

#include "server/main/sidecar_config.h"

namespace idem {

// What the command line asks for.
struct CommandLine {
  // The `migrate` subcommand: apply the migrations to `migrate_conninfo`
  // (its --postgres-direct, else the sidecar's, else its --postgres, else
  // the sidecar's) and exit. Otherwise: serve with `config`.
  bool migrate_only = false;
  std::string migrate_conninfo;
  SidecarConfig config;
};

// Parses `argv` and the environment (the flags' IDEM_* twins and the
// secrets' variables) into *out. Returns the exit code when parsing ends the
// program (--help, or a bad flag, which CLI11 reports), nullopt otherwise.
std::optional<int> ParseCommandLine(int argc, char** argv, CommandLine* out);

}  // namespace idem

#endif  // IDEM_SERVER_MAIN_SIDECAR_FLAGS_H_
