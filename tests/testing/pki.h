// Throwaway certificate authorities and certificates for TLS tests, made with
// the openssl command.
#ifndef IDEM_TESTS_TESTING_PKI_H_
#define IDEM_TESTS_TESTING_PKI_H_

#include <string>

#include "absl/status/status.h"

namespace idem::testing {

// A CA and certificates signed by it, as PEM files under `dir`.
struct Pki {
  std::string dir;

  std::string Path(const std::string& name) const { return dir + "/" + name; }

  // A self-signed CA `name`.pem/.key.
  absl::Status MakeCa(const std::string& name) const;

  // A certificate `name`.pem/.key signed by `ca`, valid for `days` (-1:
  // already expired), with subjectAltName `san`.
  absl::Status MakeCert(const std::string& name, const std::string& ca,
                        const std::string& san,
                        const std::string& days = "2") const;
};

}  // namespace idem::testing

#endif  // IDEM_TESTS_TESTING_PKI_H_
