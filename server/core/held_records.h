// Records this instance granted (Begin answered ACQUIRED) whose holder has
// not finished them yet. Heartbeat, Complete and Fail with the granted
// fencing token decide on the held record instead of reading it first: one
// round trip instead of two. That is safe because their writes are guarded
// by status and fencing token, and a guarded write keeps the stored lease:
// if the record changed meanwhile (its lease expired, another instance took
// it over), the guard fails and the coordinator reads and decides again.
// A sidecar next to its service sees the whole lifecycle of a key, so the
// read is skipped for nearly every Complete. Bounded: beyond `capacity`
// records the oldest grant is forgotten (its holder's calls then read).
// Thread-safe.
#ifndef IDEM_SERVER_CORE_HELD_RECORDS_H_
#define IDEM_SERVER_CORE_HELD_RECORDS_H_

#include <cstddef>
#include <list>
#include <optional>
#include <string>
#include <unordered_map>

#include "absl/base/thread_annotations.h"
#include "common/steady_wait.h"
#include "statemachine/record.h"

namespace idem {

class HeldRecords {
 public:
  explicit HeldRecords(size_t capacity) : capacity_(capacity) {}
  HeldRecords(const HeldRecords&) = delete;
  HeldRecords& operator=(const HeldRecords&) = delete;

  // Holds `granted` (a PROCESSING record as written), replacing any record
  // held for its key. No-op with capacity 0.
  void Put(const Record& granted);
  // The record held for `key` if its fencing token is `token`.
  std::optional<Record> Find(const RecordKey& key, int64_t token) const;
  // Forgets the record held for `key`, if any.
  void Erase(const RecordKey& key);

  size_t size() const;

 private:
  struct Entry {
    Record record;
    std::list<std::string>::iterator age;
  };
  static std::string Id(const RecordKey& key);

  const size_t capacity_;
  mutable SteadyMutex mu_;
  std::unordered_map<std::string, Entry> held_ ABSL_GUARDED_BY(mu_);
  // Ids of held_, oldest grant first.
  std::list<std::string> ages_ ABSL_GUARDED_BY(mu_);
};

}  // namespace idem

#endif  // IDEM_SERVER_CORE_HELD_RECORDS_H_
