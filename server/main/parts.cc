#include "server/main/parts.h"

#include <utility>

namespace idem {

void Parts::Add(std::string name, StartFn start, StopFn stop) {
  parts_.push_back(Part{std::move(name), std::move(start), std::move(stop)});
}

absl::Status Parts::Start() {
  while (started_ < parts_.size()) {
    const Part& part = parts_[started_];
    absl::Status s = part.start ? part.start() : absl::OkStatus();
    if (!s.ok()) {
      Stop();
      return s;
    }
    ++started_;
  }
  return absl::OkStatus();
}

void Parts::Stop() {
  while (started_ > 0) {
    --started_;
    const Part& part = parts_[started_];
    if (part.stop) part.stop();
  }
}

std::vector<std::string> Parts::Names() const {
  std::vector<std::string> names;
  names.reserve(parts_.size());
  for (const Part& part : parts_) names.push_back(part.name);
  return names;
}

}  // namespace idem
