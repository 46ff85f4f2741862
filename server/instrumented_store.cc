#include "server/instrumented_store.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/time/clock.h"

namespace idem {
namespace {

class InstrumentedStore final : public Store {
 public:
  InstrumentedStore(std::unique_ptr<Store> base, std::string name,
                    Metrics* metrics)
      : base_(std::move(base)), name_(std::move(name)), metrics_(metrics) {}

  absl::StatusOr<StoreRead> Read(const RecordKey& key) override {
    return Timed("read", [&] { return base_->Read(key); });
  }
  // Not timed: a cache lookup times itself (store="redis").
  std::optional<Record> ReadCached(const RecordKey& key) override {
    return base_->ReadCached(key);
  }
  absl::StatusOr<std::optional<Record>> Apply(const Write& write) override {
    return Timed(write.guard ? "update" : "insert",
                 [&] { return base_->Apply(write); });
  }
  absl::Status Ping() override {
    return Timed("ping", [&] { return base_->Ping(); });
  }
  absl::StatusOr<std::vector<AuditEntry>> History(
      const RecordKey& key) override {
    return Timed("history", [&] { return base_->History(key); });
  }
  absl::StatusOr<std::vector<Record>> List(const ListQuery& query) override {
    return Timed("list", [&] { return base_->List(query); });
  }
  absl::StatusOr<std::vector<Record>> ExpireLeases(
      int limit, const ExpireFn& expire) override {
    return Timed("expire", [&] { return base_->ExpireLeases(limit, expire); });
  }
  absl::StatusOr<std::vector<RecordKey>> Purge(int limit) override {
    return Timed("purge", [&] { return base_->Purge(limit); });
  }
  absl::StatusOr<StoreStats> Stats() override {
    return Timed("stats", [&] { return base_->Stats(); });
  }

 private:
  template <typename Fn>
  auto Timed(const char* op, Fn fn) -> decltype(fn()) {
    const absl::Time start = absl::Now();
    auto result = fn();
    metrics_->ObserveStore(name_, op, absl::Now() - start);
    absl::Status status = StatusOf(result);
    if (!status.ok()) {
      metrics_->StoreError(name_, absl::AsciiStrToLower(
                                      absl::StatusCodeToString(status.code())));
    }
    return result;
  }

  static absl::Status StatusOf(const absl::Status& s) { return s; }
  template <typename T>
  static absl::Status StatusOf(const absl::StatusOr<T>& s) {
    return s.status();
  }

  const std::unique_ptr<Store> base_;
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
