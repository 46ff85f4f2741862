#include "tests/testing/pki.h"

#include <fstream>
#include <vector>

#include "tests/testing/process.h"

namespace idem::testing {
namespace {

absl::Status Openssl(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"openssl"};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCommand(argv).status();
}

}  // namespace

absl::Status Pki::MakeCa(const std::string& name) const {
  return Openssl({"req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                  Path(name + ".key"), "-out", Path(name + ".pem"), "-days",
                  "2", "-subj", "/CN=" + name});
}

absl::Status Pki::MakeCert(const std::string& name, const std::string& ca,
                           const std::string& san,
                           const std::string& days) const {
  std::ofstream(Path(name + ".ext")) << "subjectAltName=" << san << "\n";
  absl::Status s = Openssl({"req", "-newkey", "rsa:2048", "-nodes", "-keyout",
                            Path(name + ".key"), "-out", Path(name + ".csr"),
                            "-subj", "/CN=" + name});
  if (!s.ok()) return s;
  return Openssl({"x509", "-req", "-in", Path(name + ".csr"), "-CA",
                  Path(ca + ".pem"), "-CAkey", Path(ca + ".key"),
                  "-CAcreateserial", "-out", Path(name + ".pem"), "-days", days,
                  "-extfile", Path(name + ".ext")});
}

}  // namespace idem::testing
