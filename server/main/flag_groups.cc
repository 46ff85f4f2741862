#include "server/main/flag_groups.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_replace.h"

namespace idem {

std::string EnvName(const std::string& flag) {
  return "IDEM_" +
         absl::AsciiStrToUpper(absl::StrReplaceAll(flag, {{"-", "_"}}));
}

void AddPostgresFlags(CLI::App* app, PostgresFlags* flags) {
  AddOption(app, "postgres", &flags->conninfo,
            "PostgreSQL conninfo or URI (e.g. "
            "postgresql://user@host/db?sslmode=require)");
  AddOption(app, "postgres-direct", &flags->direct,
            "PostgreSQL conninfo of a session connection, for LISTEN and the "
            "migrations' advisory lock, when --postgres names a "
            "transaction-pooling PgBouncer (default: --postgres)");
}

void AddTlsKeyPairFlags(CLI::App* app, const std::string& cert_help,
                        TlsKeyPairFlags* flags) {
  AddOption(app, "tls-cert", &flags->cert, cert_help);
  AddOption(app, "tls-key", &flags->key, "PEM private key for --tls-cert");
}

}  // namespace idem
