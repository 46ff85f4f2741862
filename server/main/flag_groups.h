// Flag groups that more than one binary declares: the same names, IDEM_*
// environment twins and help, written once. idemctl links this library too.
#ifndef IDEM_SERVER_MAIN_FLAG_GROUPS_H_
#define IDEM_SERVER_MAIN_FLAG_GROUPS_H_

#include <CLI/CLI.hpp>
#include <string>

namespace idem {

// The environment twin of --`flag`: IDEM_ and the name in capitals, '-' as
// '_' (pg-pool-size: IDEM_PG_POOL_SIZE).
std::string EnvName(const std::string& flag);

// Declares --`flag` bound to *value, with its EnvName twin and its default
// shown in --help (when not empty).
template <typename T>
CLI::Option* AddOption(CLI::App* app, const std::string& flag, T* value,
                       const std::string& help) {
  return app->add_option("--" + flag, *value, help)
      ->envname(EnvName(flag))
      ->capture_default_str();
}

// Declares the boolean --`flag` and its EnvName twin.
inline CLI::Option* AddFlag(CLI::App* app, const std::string& flag, bool* value,
                            const std::string& help) {
  return app->add_flag("--" + flag, *value, help)->envname(EnvName(flag));
}

// --postgres and --postgres-direct (IDEM_POSTGRES, IDEM_POSTGRES_DIRECT).
struct PostgresFlags {
  std::string conninfo;
  std::string direct;
};

// Declares the PostgreSQL group on `app` (the sidecar, or its migrate
// subcommand). `flags` must outlive the parse.
void AddPostgresFlags(CLI::App* app, PostgresFlags* flags);

// --tls-cert and --tls-key (IDEM_TLS_CERT, IDEM_TLS_KEY): a PEM certificate
// chain and its private key; the sidecar's own, or idemctl's client
// certificate.
struct TlsKeyPairFlags {
  std::string cert;
  std::string key;
};

// Declares the key pair on `app`, with `cert_help` saying whose
// certificate it is. `flags` must outlive the parse.
void AddTlsKeyPairFlags(CLI::App* app, const std::string& cert_help,
                        TlsKeyPairFlags* flags);

}  // namespace idem

#endif  // IDEM_SERVER_MAIN_FLAG_GROUPS_H_
