// Credentials for the gRPC port: TLS, or mutual TLS with a client CA, from
// PEM files that are re-read when they change (new connections get the new
// certificates; open ones are not dropped).
#ifndef IDEM_SERVER_RPC_TLS_H_
#define IDEM_SERVER_RPC_TLS_H_

#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace idem {

struct TlsFiles {
  std::string cert;       // --tls-cert: the server's certificate chain
  std::string key;        // --tls-key: its private key
  std::string client_ca;  // --tls-client-ca: set = require client certs
};

// Insecure credentials when no file is given; otherwise TLS from `files`,
// watched every `refresh`. INVALID_ARGUMENT naming the flag when a file is
// missing or only one of cert and key is given.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFor(
    const TlsFiles& files, absl::Duration refresh = absl::Seconds(1));

}  // namespace idem

#endif  // IDEM_SERVER_RPC_TLS_H_
