#include "server/instrumented_store.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "common/steady_wait.h"

namespace idem {
namespace {

class InstrumentedStore final : public StoreWrapper {
 public:
  InstrumentedStore(std::unique_ptr<Store> base, std::string name,
                    Metrics* metrics)
      : StoreWrapper(std::move(base)),
        name_(std::move(name)),
        metrics_(metrics) {}

  absl::StatusOr<StoreRead> Read(const RecordKey& key) override {
    return Timed("read", [&] { return base()->Read(key); });
  }
  absl::StatusOr<std::optional<Record>> Apply(const Write& write) override {
    return Timed(write.guard ? "update" : "insert",
                 [&] { return base()->Apply(write); });
  }
  // Counted as the insert it starts with (Begin's first statement).
  absl::StatusOr<InsertOrReadResult> InsertOrRead(const Write& write) override {
    return Timed("insert", [&] { return base()->InsertOrRead(write); });
  }
  bool InsertOrReadAsync(const Write& write, InsertOrReadFn done) override {
    const SteadyTime start = SteadyClock::now();
    return base()->InsertOrReadAsync(
        write, [this, start,
                done = std::move(done)](absl::StatusOr<InsertOrReadResult> r) {
          Observe("insert", start, r.status());
          done(std::move(r));
        });
  }
  bool ApplyAsync(const Write& write, ApplyFn done) override {
    const SteadyTime start = SteadyClock::now();
    return base()->ApplyAsync(write,
                              [this, start, done = std::move(done)](
                                  absl::StatusOr<std::optional<Record>> r) {
                                Observe("update", start, r.status());
                                done(std::move(r));
                              });
  }
  absl::Status Ping() override {
    return Timed("ping", [&] { return base()->Ping(); });
  }
  absl::StatusOr<std::vector<AuditEntry>> History(
      const RecordKey& key) override {
    return Timed("history", [&] { return base()->History(key); });
  }
  absl::StatusOr<std::vector<Record>> List(const ListQuery& query) override {
    return Timed("list", [&] { return base()->List(query); });
  }
  absl::StatusOr<std::vector<Record>> ExpireLeases(
      int limit, const ExpireFn& expire) override {
    return Timed("expire", [&] { return base()->ExpireLeases(limit, expire); });
  }
  absl::StatusOr<std::vector<RecordKey>> Purge(int limit) override {
    return Timed("purge", [&] { return base()->Purge(limit); });
  }
  absl::StatusOr<StoreStats> Stats() override {
    return Timed("stats", [&] { return base()->Stats(); });
  }
  absl::StatusOr<std::vector<ReconcileClaim>> ClaimUnknown(
      const std::map<std::string, int>& max_attempts, absl::Duration backoff,
      absl::Duration max_backoff, int limit) override {
    return Timed("claim", [&] {
      return base()->ClaimUnknown(max_attempts, backoff, max_backoff, limit);
    });
  }
  absl::StatusOr<int64_t> CountProcessing(const std::string& tenant) override {
    return Timed("count_processing",
                 [&] { return base()->CountProcessing(tenant); });
  }

 private:
  template <typename Fn>
  auto Timed(const char* op, Fn fn) -> decltype(fn()) {
    const SteadyTime start = SteadyClock::now();
    auto result = fn();
    Observe(op, start, StatusOf(result));
    return result;
  }

  // Records a call of `op` that began at `start` and ended with `status`.
  void Observe(const char* op, SteadyTime start, const absl::Status& status) {
    metrics_->ObserveStore(name_, op, SteadySince(start));
    if (!status.ok()) {
      metrics_->StoreError(name_, absl::AsciiStrToLower(
                                      absl::StatusCodeToString(status.code())));
    }
  }

  static absl::Status StatusOf(const absl::Status& s) { return s; }
  template <typename T>
  static absl::Status StatusOf(const absl::StatusOr<T>& s) {
    return s.status();
  }

  const std::string name_;
  Metrics* const metrics_;
};

}  // namespace

std::unique_ptr<Store> NewInstrumentedStore(std::unique_ptr<Store> base,
                                            std::string name,
                                            Metrics* metrics) {
  return std::make_unique<InstrumentedStore>(std::move(base), std::move(name),
                                             metrics);
}

}  // namespace idem
