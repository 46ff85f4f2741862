#include "server/core/probe_dial.h"

#include <algorithm>
#include <fstream>
#include <iterator>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"

namespace idem {

absl::StatusOr<ProbeDial> PrepareProbeDial(const ProbeTls& tls,
                                           size_t max_snapshot_bytes) {
  ProbeDial dial;
  dial.args.SetMaxReceiveMessageSize(
      static_cast<int>(std::max<size_t>(4 << 20, max_snapshot_bytes * 2)));
  if (!tls.enabled) {
    dial.credentials = grpc::InsecureChannelCredentials();
    return dial;
  }
  grpc::SslCredentialsOptions ssl;
  for (const auto& [name, path, out] :
       {std::tuple{"ca", &tls.ca, &ssl.pem_root_certs},
        std::tuple{"cert", &tls.cert, &ssl.pem_cert_chain},
        std::tuple{"key", &tls.key, &ssl.pem_private_key}}) {
    if (path->empty()) continue;
    std::ifstream in(*path, std::ios::binary);
    if (!in) {
      return absl::FailedPreconditionError(
          absl::StrCat("probe_tls.", name, ": cannot read ", *path));
    }
    std::string text((std::istreambuf_iterator<char>(in)),
                     std::istreambuf_iterator<char>());
    absl::StrAppend(&dial.pem, text, "\n");
    *out = std::move(text);
  }
  if (!tls.server_name.empty()) {
    dial.args.SetSslTargetNameOverride(tls.server_name);
  }
  dial.credentials = grpc::SslCredentials(ssl);
  return dial;
}

}  // namespace idem
