// The base of the cache decorators (Redis, in-process): a StoreWrapper that
// sees every record the store below returns, with the store's clock at that
// moment, so that a cache can keep the ones it may.
#ifndef IDEM_SERVER_CACHE_FILL_H_
#define IDEM_SERVER_CACHE_FILL_H_

#include <functional>
#include <memory>
#include <optional>
#include <utility>

#include "absl/time/time.h"
#include "common/steady_wait.h"
#include "server/store.h"

namespace idem {

class CacheFillingStore : public StoreWrapper {
 public:
  using StoreWrapper::StoreWrapper;

  absl::StatusOr<StoreRead> Read(const RecordKey& key) override {
    const SteadyTime start = SteadyClock::now();
    absl::StatusOr<StoreRead> read = base()->Read(key);
    FillFrom(read, start);
    return read;
  }

  absl::StatusOr<InsertOrReadResult> InsertOrRead(const Write& write) override {
    const SteadyTime start = SteadyClock::now();
    absl::StatusOr<InsertOrReadResult> r = base()->InsertOrRead(write);
    FillFrom(r, start);
    return r;
  }

  absl::StatusOr<std::optional<Record>> Apply(const Write& write) override {
    const SteadyTime start = SteadyClock::now();
    absl::StatusOr<std::optional<Record>> written = base()->Apply(write);
    FillFrom(written, start);
    return written;
  }

  // The async calls fill through FillAsync and call `done` after it.
  bool InsertOrReadAsync(const Write& write, InsertOrReadFn done) override {
    const SteadyTime start = SteadyClock::now();
    return base()->InsertOrReadAsync(
        write, [this, start, done = std::move(done)](
                   absl::StatusOr<InsertOrReadResult> r) mutable {
          FillThen(std::move(r), start, std::move(done));
        });
  }

  bool ApplyAsync(const Write& write, ApplyFn done) override {
    const SteadyTime start = SteadyClock::now();
    return base()->ApplyAsync(
        write, [this, start, done = std::move(done)](
                   absl::StatusOr<std::optional<Record>> written) mutable {
          FillThen(std::move(written), start, std::move(done));
        });
  }

 protected:
  // `record` as the store returned it, at `store_now` by the store's clock;
  // the store call began `elapsed` ago (steady clock: a wall-clock step
  // must not stretch a TTL). Keeps it if it may (redis_codec.h CacheTtl).
  virtual void Fill(const Record& record, absl::Time store_now,
                    absl::Duration elapsed) = 0;

  // Fill for a store's async completion: runs `then` once `record` is kept
  // (or not), on this thread or one of the cache's own. `record` is read
  // before this returns. This default fills at once.
  // By value, as the caches that run it keep `then` (NOLINT below).
  virtual void FillAsync(
      const Record& record, absl::Time store_now, absl::Duration elapsed,
      std::function<void()>
          then) {  // NOLINT(performance-unnecessary-value-param)
    Fill(record, store_now, elapsed);
    then();
  }

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

  // Fills from what a store call started at `start` returned.
  template <typename Result>
  void FillFrom(const Result& result, SteadyTime start) {
    if (std::optional<Found> f = Of(result)) {
      Fill(*f->record, f->store_now, SteadySince(start));
    }
  }

  // FillFrom for an async completion, then `done(result)`.
  template <typename Result, typename Done>
  void FillThen(Result result, SteadyTime start, Done done) {
    if (!Of(result)) return done(std::move(result));
    // On the heap: FillAsync reads the record while `then` owns it.
    auto owned = std::make_shared<Result>(std::move(result));
    const Found f = *Of(*owned);
    FillAsync(
        *f.record, f.store_now, SteadySince(start),
        [done = std::move(done), owned]() mutable { done(std::move(*owned)); });
  }
};

}  // namespace idem

#endif  // IDEM_SERVER_CACHE_FILL_H_
