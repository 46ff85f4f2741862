// SHA-256 (FIPS 180-4), small and dependency-free, for request fingerprints.
#ifndef IDEM_CLIENT_SHA256_H_
#define IDEM_CLIENT_SHA256_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace idem {

// Incremental SHA-256. Not thread-safe; cheap to copy (copying forks the
// computation).
class Sha256 {
 public:
  // The digest size in bytes.
  static constexpr size_t kDigestSize = 32;

  Sha256();

  // Appends `data` to the message.
  void Update(absl::string_view data);

  // Returns the 32-byte digest of everything appended so far and resets the
  // object to the empty message.
  std::string Finish();

 private:
  void Compress(const uint8_t* block);

  uint32_t state_[8];
  uint8_t buffer_[64];
  size_t buffered_;  // bytes in buffer_
  uint64_t length_;  // message length in bytes
};

// Returns the 32-byte SHA-256 digest of `data`.
std::string Sha256Digest(absl::string_view data);

}  // namespace idem

#endif  // IDEM_CLIENT_SHA256_H_
