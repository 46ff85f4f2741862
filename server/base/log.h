// Structured logs: one JSON object per line on stderr.
#ifndef IDEM_SERVER_BASE_LOG_H_
#define IDEM_SERVER_BASE_LOG_H_

#include <string>
#include <utility>
#include <vector>

namespace idem {

enum class LogLevel { kDebug, kInfo, kWarn, kError };

// Sets the lowest level written (default kInfo). Thread-safe.
void SetLogLevel(LogLevel level);
// Parses "debug", "info", "warn" or "error"; false otherwise.
bool ParseLogLevel(const std::string& name, LogLevel* out);

using LogFields = std::vector<std::pair<std::string, std::string>>;

// Writes {"ts":..., "level":..., "msg": msg, fields...} as one line.
// Thread-safe; lines never interleave. Never pass secrets in `fields`.
void Log(LogLevel level, const std::string& msg, const LogFields& fields = {});

}  // namespace idem

#endif  // IDEM_SERVER_BASE_LOG_H_
