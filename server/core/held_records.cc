#include "server/core/held_records.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace idem {

std::string HeldRecords::Id(const RecordKey& key) {
  // Tenants and operations are names without NUL bytes (validation.cc).
  return absl::StrCat(key.tenant, std::string(1, '\0'), key.operation,
                      std::string(1, '\0'), key.key);
}

void HeldRecords::Put(const Record& granted) {
  if (capacity_ == 0) return;
  std::string id = Id(granted.key);
  SteadyMutexLock lock(&mu_);
  auto it = held_.find(id);
  if (it != held_.end()) {
    it->second.record = granted;
    ages_.splice(ages_.end(), ages_, it->second.age);
    return;
  }
  if (held_.size() >= capacity_) {
    held_.erase(ages_.front());
    ages_.pop_front();
  }
  ages_.push_back(id);
  held_.emplace(std::move(id), Entry{granted, std::prev(ages_.end())});
}

std::optional<Record> HeldRecords::Find(const RecordKey& key,
                                        int64_t token) const {
  const std::string id = Id(key);
  SteadyMutexLock lock(&mu_);
  auto it = held_.find(id);
  if (it == held_.end() || it->second.record.fencing_token != token) {
    return std::nullopt;
  }
  return it->second.record;
}

void HeldRecords::Erase(const RecordKey& key) {
  const std::string id = Id(key);
  SteadyMutexLock lock(&mu_);
  auto it = held_.find(id);
  if (it == held_.end()) return;
  ages_.erase(it->second.age);
  held_.erase(it);
}

size_t HeldRecords::size() const {
  SteadyMutexLock lock(&mu_);
  return held_.size();
}

}  // namespace idem
