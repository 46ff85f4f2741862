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
    if (read.ok() && read->record) {
      Fill(*read->record, read->now, SteadySince(start));
    }
    return read;
  }

  absl::StatusOr<InsertOrReadResult> InsertOrRead(const Write& write) override {
    const SteadyTime start = SteadyClock::now();
    absl::StatusOr<InsertOrReadResult> r = base()->InsertOrRead(write);
    FillFound(r, start);
    return r;
  }

  // The async calls fill through FillAsync and call `done` after it.
  bool InsertOrReadAsync(const Write& write, InsertOrReadFn done) override {
    const SteadyTime start = SteadyClock::now();
    return base()->InsertOrReadAsync(
        write, [this, start,
                done = std::move(done)](absl::StatusOr<InsertOrReadResult> r) {
          if (!r.ok() || !r->existing || !r->existing->record) {
            return done(std::move(r));
          }
          // On the heap: FillAsync reads the record while `then` owns it.
          auto owned = std::make_shared<absl::StatusOr<InsertOrReadResult>>(
              std::move(r));
          const StoreRead& found = *(*owned)->existing;
          FillAsync(*found.record, found.now, SteadySince(start),
                    [done, owned] { done(std::move(*owned)); });
        });
  }

  absl::StatusOr<std::optional<Record>> Apply(const Write& write) override {
    const SteadyTime start = SteadyClock::now();
    absl::StatusOr<std::optional<Record>> written = base()->Apply(write);
    FillWritten(written, start);
    return written;
  }

  bool ApplyAsync(const Write& write, ApplyFn done) override {
    const SteadyTime start = SteadyClock::now();
    return base()->ApplyAsync(
        write, [this, start, done = std::move(done)](
                   absl::StatusOr<std::optional<Record>> written) {
          if (!written.ok() || !written->has_value()) {
            return done(std::move(written));
          }
          auto owned = std::make_shared<absl::StatusOr<std::optional<Record>>>(
              std::move(written));
          const Record& record = ***owned;
          FillAsync(record, record.updated_at, SteadySince(start),
                    [done, owned] { done(std::move(*owned)); });
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
  virtual void FillAsync(const Record& record, absl::Time store_now,
                         absl::Duration elapsed, std::function<void()> then) {
    Fill(record, store_now, elapsed);
    then();
  }

 private:
  // Fills from the record an Apply started at `start` wrote. A store stamps
  // a write's updated_at with its own clock.
  void FillWritten(const absl::StatusOr<std::optional<Record>>& written,
                   SteadyTime start) {
    if (written.ok() && written->has_value()) {
      Fill(**written, (*written)->updated_at, SteadySince(start));
    }
  }

  // Fills from the record an InsertOrRead started at `start` ran into.
  void FillFound(const absl::StatusOr<InsertOrReadResult>& r,
                 SteadyTime start) {
    if (r.ok() && r->existing && r->existing->record) {
      Fill(*r->existing->record, r->existing->now, SteadySince(start));
    }
  }
};

}  // namespace idem

#endif  // IDEM_SERVER_CACHE_FILL_H_
