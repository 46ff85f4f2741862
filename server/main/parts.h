// An ordered list of the parts of a process: started in the order added,
// stopped in reverse, so that each part stops while what it uses still
// runs.
#ifndef IDEM_SERVER_MAIN_PARTS_H_
#define IDEM_SERVER_MAIN_PARTS_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace idem {

// Not thread-safe: one thread (main's) builds, starts and stops it.
class Parts {
 public:
  using StartFn = std::function<absl::Status()>;
  using StopFn = std::function<void()>;

  // Appends a part; `start` and `stop` may be null (nothing to do).
  void Add(std::string name, StartFn start, StopFn stop);

  // Starts the parts in the order added. On the first that fails, stops
  // those already started, last first, and returns its error.
  absl::Status Start();

  // Stops the started parts, last started first. Later calls do nothing.
  void Stop();

  // The parts' names in the order they start.
  std::vector<std::string> Names() const;

 private:
  struct Part {
    std::string name;
    StartFn start;
    StopFn stop;
  };
  std::vector<Part> parts_;
  // parts_[0, started_) are running.
  size_t started_ = 0;
};

}  // namespace idem

#endif  // IDEM_SERVER_MAIN_PARTS_H_
