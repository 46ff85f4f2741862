// Structured logs: one JSON object per line on stderr.
#ifndef IDEM_SERVER_BASE_LOG_H_
#define IDEM_SERVER_BASE_LOG_H_

#include <atomic>
#include <chrono>
#include <cstdint>
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

// At most one log line a second, on the steady clock, for a message a
// caller could otherwise repeat until it floods the log; counts the ones
// left out. Thread-safe.
class OncePerSecond {
 public:
  // Whether a line may be logged now; if so, `*skipped` is how many were
  // left out since the last one.
  bool Due(int64_t* skipped) {
    const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::steady_clock::now().time_since_epoch())
                            .count();
    int64_t due = next_ms_.load(std::memory_order_relaxed);
    if (now < due || !next_ms_.compare_exchange_strong(due, now + 1000)) {
      left_out_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    *skipped = left_out_.exchange(0, std::memory_order_relaxed);
    return true;
  }

 private:
  std::atomic<int64_t> next_ms_{0};
  std::atomic<int64_t> left_out_{0};
};

}  // namespace idem

#endif  // IDEM_SERVER_BASE_LOG_H_
