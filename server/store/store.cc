#include "server/store/store.h"

#include <memory>
#include <utility>

namespace idem {

void RecordStore::InsertOrRead(const Write& write, InsertOrReadFn done) {
  Apply(write, [this, key = write.next.key, done = std::move(done)](
                   absl::StatusOr<std::optional<Record>> written) mutable {
    if (!written.ok()) return done(written.status());
    InsertOrReadResult out;
    if (written->has_value()) {
      out.created = *std::move(*written);
      return done(std::move(out));
    }
    Read(key, [done = std::move(done)](absl::StatusOr<StoreRead> read) {
      if (!read.ok()) return done(read.status());
      InsertOrReadResult found;
      found.existing = *std::move(read);
      done(std::move(found));
    });
  });
}

}  // namespace idem
