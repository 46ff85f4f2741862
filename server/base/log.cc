#include "server/base/log.h"

#include <atomic>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace idem {
namespace {

std::atomic<int> min_level{static_cast<int>(LogLevel::kInfo)};

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarn:
      return "warn";
    case LogLevel::kError:
      return "error";
  }
  return "info";
}

}  // namespace

void SetLogLevel(LogLevel level) { min_level = static_cast<int>(level); }

bool ParseLogLevel(const std::string& name, LogLevel* out) {
  for (LogLevel l :
       {LogLevel::kDebug, LogLevel::kInfo, LogLevel::kWarn, LogLevel::kError}) {
    if (name == LevelName(l)) {
      *out = l;
      return true;
    }
  }
  return false;
}

void Log(LogLevel level, const std::string& msg, const LogFields& fields) {
  if (static_cast<int>(level) < min_level) return;
  nlohmann::json line;
  line["ts"] = absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(),
                                absl::UTCTimeZone());
  line["level"] = LevelName(level);
  line["msg"] = msg;
  for (const auto& [k, v] : fields) line[k] = v;
  // One fputs per line: stdio locks the stream, so lines never interleave.
  std::string text =
      line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
      "\n";
  std::fputs(text.c_str(), stderr);
}

}  // namespace idem
