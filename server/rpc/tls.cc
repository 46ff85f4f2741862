#include "server/rpc/tls.h"

#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"

namespace idem {
namespace {

absl::Status Readable(const std::string& flag, const std::string& path) {
  if (access(path.c_str(), R_OK) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, "=", path, ": cannot read the file"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFor(
    const TlsFiles& files, absl::Duration refresh) {
  if (files.cert.empty() && files.key.empty() && files.client_ca.empty()) {
    return grpc::InsecureServerCredentials();
  }
  if (files.cert.empty() || files.key.empty()) {
    return absl::InvalidArgumentError(
        "--tls-cert and --tls-key: both are required for TLS");
  }
  for (const auto& [flag, path] :
       {std::pair{"tls-cert", files.cert}, std::pair{"tls-key", files.key}}) {
    absl::Status s = Readable(flag, path);
    if (!s.ok()) return s;
  }
  if (!files.client_ca.empty()) {
    absl::Status s = Readable("tls-client-ca", files.client_ca);
    if (!s.ok()) return s;
  }
  const unsigned int seconds = static_cast<unsigned int>(
      std::max<int64_t>(1, absl::ToInt64Seconds(refresh)));
  auto provider = files.client_ca.empty()
                      ? std::make_shared<
                            grpc::experimental::FileWatcherCertificateProvider>(
                            files.key, files.cert, seconds)
                      : std::make_shared<
                            grpc::experimental::FileWatcherCertificateProvider>(
                            files.key, files.cert, files.client_ca, seconds);
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (files.client_ca.empty()) {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  } else {
    options.watch_root_certs();
    options.set_cert_request_type(
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  }
  return grpc::experimental::TlsServerCredentials(options);
}

}  // namespace idem
