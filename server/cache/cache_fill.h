// The base of the cache decorators (Redis, in-process): a RecordStoreWrapper
// that sees every record the store below returns, with the store's clock at
// that moment, so that a cache can keep the ones it may.
#ifndef IDEM_SERVER_CACHE_CACHE_FILL_H_
#define IDEM_SERVER_CACHE_CACHE_FILL_H_

#include <functional>
#include <memory>
#include <optional>
#include <utility>

#include "absl/time/time.h"
#include "common/steady_wait.h"
#include "server/store/store.h"

namespace idem {

class CacheFillingStore : public RecordStoreWrapper {
 public:
  using RecordStoreWrapper::RecordStoreWrapper;

  // Each call fills through Fill and calls `done` after it.
  void Read(const RecordKey& key, ReadFn done) override {
    const SteadyTime start = SteadyClock::now();
    base()->Read(key, [this, start, done = std::move(done)](
                          absl::StatusOr<StoreRead> read) mutable {
      FillThen(std::move(read), start, std::move(done));
    });
  }

  void ReadForWaiter(const RecordKey& key, ReadFn done) override {
    const SteadyTime start = SteadyClock::now();
    base()->ReadForWaiter(key, [this, start, done = std::move(done)](
                                   absl::StatusOr<StoreRead> read) mutable {
      FillThen(std::move(read), start, std::move(done));
    });
  }

  void InsertOrRead(const Write& write, InsertOrReadFn done) override {
    const SteadyTime start = SteadyClock::now();
    base()->InsertOrRead(write,
                         [this, start, done = std::move(done)](
                             absl::StatusOr<InsertOrReadResult> r) mutable {
                           FillThen(std::move(r), start, std::move(done));
                         });
  }

  void Apply(const Write& write, ApplyFn done) override {
    const SteadyTime start = SteadyClock::now();
    base()->Apply(write,
                  [this, start, done = std::move(done)](
                      absl::StatusOr<std::optional<Record>> written) mutable {
                    FillThen(std::move(written), start, std::move(done));
                  });
  }

 protected:
  // `record` as the store returned it, at `store_now` by the store's clock;
  // the store call began `elapsed` ago (steady clock: a wall-clock step
  // must not stretch a TTL). Keeps it if it may (redis_codec.h CacheTtl),
  // then runs `then`, on this thread or one of the cache's own. `record` is
  // read before this returns.
  // By value, as the caches that run it later keep `then` (NOLINT below).
  virtual void Fill(
      const Record& record, absl::Time store_now, absl::Duration elapsed,
      std::function<void()>
          then) = 0;  // NOLINT(performance-unnecessary-value-param)

 private:
  // A record a store call returned, and the store's clock at that moment.
  struct Found {
    const Record* record;
    absl::Time store_now;
  };
  static std::optional<Found> Of(const StoreRead& read) {
    if (!read.record) return std::nullopt;
    return Found{&*read.record, read.now};
  }
  static std::optional<Found> Of(const absl::StatusOr<StoreRead>& read) {
    if (!read.ok()) return std::nullopt;
    return Of(*read);
  }
  // The record an InsertOrRead ran into.
  static std::optional<Found> Of(const absl::StatusOr<InsertOrReadResult>& r) {
    if (!r.ok() || !r->existing) return std::nullopt;
    return Of(*r->existing);
  }
  // The record an Apply wrote: a store stamps updated_at with its own clock.
  static std::optional<Found> Of(
      const absl::StatusOr<std::optional<Record>>& written) {
    if (!written.ok() || !written->has_value()) return std::nullopt;
    return Found{&**written, (*written)->updated_at};
  }

  // Fills from what a store call started at `start` returned, then
  // `done(result)`.
  template <typename Result, typename Done>
  void FillThen(Result result, SteadyTime start, Done done) {
    if (!Of(result)) return done(std::move(result));
    // On the heap: Fill reads the record while `then` owns it.
    auto owned = std::make_shared<Result>(std::move(result));
    const Found f = *Of(*owned);
    Fill(
        *f.record, f.store_now, SteadySince(start),
        [done = std::move(done), owned]() mutable { done(std::move(*owned)); });
  }
};

}  // namespace idem

#endif  // IDEM_SERVER_CACHE_CACHE_FILL_H_
