#include "server/store/instrumented_store.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "common/steady_wait.h"

namespace idem {
namespace {

class InstrumentedStore final : public StoreWrapper {
 public:
  InstrumentedStore(std::unique_ptr<Store> base, std::string name,
                    StoreMetrics* metrics)
      : StoreWrapper(std::move(base)),
        name_(std::move(name)),
        metrics_(metrics) {}

  void Read(const RecordKey& key, ReadFn done) override {
    base()->Read(key, Observed("read", std::move(done)));
  }
  void ReadForWaiter(const RecordKey& key, ReadFn done) override {
    base()->ReadForWaiter(key, Observed("read_for_waiter", std::move(done)));
  }
  void Apply(const Write& write, ApplyFn done) override {
    base()->Apply(write,
                  Observed(write.guard ? "update" : "insert", std::move(done)));
  }
  // Counted as the insert it starts with (Begin's first statement).
  void InsertOrRead(const Write& write, InsertOrReadFn done) override {
    base()->InsertOrRead(write, Observed("insert", std::move(done)));
  }
  void CountProcessing(const std::string& tenant, CountFn done) override {
    base()->CountProcessing(tenant,
                            Observed("count_processing", std::move(done)));
  }
  absl::Status Ping() override {
    return Timed("ping", [&] { return base()->Ping(); });
  }
  void History(const HistoryQuery& query, HistoryFn done) override {
    base()->History(query, Observed("history", std::move(done)));
  }
  void List(const ListQuery& query, ListFn done) override {
    base()->List(query, Observed("list", std::move(done)));
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

 private:
  // `done`, observing the call of `op` that starts now when it is called.
  template <typename T>
  std::function<void(absl::StatusOr<T>)> Observed(
      const char* op, std::function<void(absl::StatusOr<T>)> done) {
    return [this, op, start = SteadyClock::now(),
            done = std::move(done)](absl::StatusOr<T> result) {
      Observe(op, start, result.status());
      done(std::move(result));
    };
  }

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
  StoreMetrics* const metrics_;
};

}  // namespace

std::unique_ptr<Store> NewInstrumentedStore(std::unique_ptr<Store> base,
                                            std::string name,
                                            StoreMetrics* metrics) {
  return std::make_unique<InstrumentedStore>(std::move(base), std::move(name),
                                             metrics);
}

}  // namespace idem
