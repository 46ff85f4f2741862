#include "server/main/flag_groups.h"

namespace idem {

void AddPostgresFlags(CLI::App* app, PostgresFlags* flags) {
  app->add_option("--postgres", flags->conninfo,
                  "PostgreSQL conninfo or URI (e.g. "
                  "postgresql://user@host/db?sslmode=require)")
      ->envname("IDEM_POSTGRES");
  app->add_option("--postgres-direct", flags->direct,
                  "PostgreSQL conninfo of a session connection, for LISTEN "
                  "and the migrations' advisory lock, when --postgres names "
                  "a transaction-pooling PgBouncer (default: --postgres)")
      ->envname("IDEM_POSTGRES_DIRECT");
}

void AddTlsKeyPairFlags(CLI::App* app, const std::string& cert_help,
                        TlsKeyPairFlags* flags) {
  app->add_option("--tls-cert", flags->cert, cert_help)
      ->envname("IDEM_TLS_CERT");
  app->add_option("--tls-key", flags->key, "PEM private key for --tls-cert")
      ->envname("IDEM_TLS_KEY");
}

}  // namespace idem
