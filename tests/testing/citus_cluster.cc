#include "tests/testing/citus_cluster.h"

#include <unistd.h>

#include <cstdlib>
#include <thread>

#include "absl/strings/str_cat.h"

namespace idem::testing {
namespace {

// Every node: Citus must be preloaded before CREATE EXTENSION; a shard
// moves by logical replication while it takes writes.
const std::vector<std::string>& NodeSettings() {
  static const std::vector<std::string>* settings =
      new std::vector<std::string>{"shared_preload_libraries = 'citus'",
                                   "wal_level = logical",
                                   // The coordinator's own tasks connect to
                                   // it by this name, which might resolve
                                   // to ::1, where nothing listens.
                                   "citus.local_hostname = '127.0.0.1'"};
  return *settings;
}

absl::StatusOr<std::unique_ptr<PgCluster>> StartNode() {
  absl::StatusOr<std::unique_ptr<PgCluster>> node =
      PgCluster::Start(NodeSettings());
  if (!node.ok()) return node.status();
  absl::StatusOr<std::string> out = (*node)->Psql("CREATE EXTENSION citus");
  if (!out.ok()) {
    return absl::Status(
        out.status().code(),
        absl::StrCat("CREATE EXTENSION citus on port ", (*node)->port(), ": ",
                     out.status().message(), "\n--- log ---\n",
                     (*node)->Log()));
  }
  return node;
}

}  // namespace

bool UseCitus() {
  const char* env = std::getenv("IDEM_TEST_CITUS");
  return env != nullptr && std::string(env) == "1";
}

absl::Status CitusAvailable() {
  const std::string bindir = PgCluster::BinDir();
  // The binaries' sibling lib/ is PostgreSQL's pkglibdir on Debian.
  const std::string lib =
      bindir.empty() ? "" : bindir.substr(0, bindir.rfind('/')) + "/lib";
  if (lib.empty() || access((lib + "/citus.so").c_str(), R_OK) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Citus is not installed for the PostgreSQL in ",
        bindir.empty() ? "PATH" : bindir, " (no ", lib.empty() ? "" : lib,
        "/citus.so); build it for PostgreSQL 15 (docs/scaling.md)"));
  }
  return absl::OkStatus();
}

bool CitusRequired() {
  const char* env = std::getenv("CI");
  return env != nullptr && std::string(env) == "true";
}

absl::StatusOr<std::unique_ptr<CitusCluster>> CitusCluster::Start(int workers) {
  if (absl::Status s = CitusAvailable(); !s.ok()) return s;
  std::unique_ptr<CitusCluster> cluster(new CitusCluster());
  // The nodes start side by side: initdb and start-up dominate.
  std::vector<absl::StatusOr<std::unique_ptr<PgCluster>>> nodes;
  for (int i = 0; i <= workers; ++i) {
    nodes.emplace_back(absl::UnknownError("not started"));
  }
  {
    std::vector<std::thread> threads;
    for (int i = 0; i <= workers; ++i) {
      threads.emplace_back([&nodes, i] { nodes[i] = StartNode(); });
    }
    for (std::thread& t : threads) t.join();
  }
  for (auto& node : nodes) {
    if (!node.ok()) return node.status();
  }
  cluster->coordinator_ = *std::move(nodes[0]);
  absl::StatusOr<std::string> out = cluster->coordinator_->Psql(
      absl::StrCat("SELECT citus_set_coordinator_host('127.0.0.1', ",
                   cluster->coordinator_->port(), ")"));
  if (!out.ok()) return out.status();
  for (int i = 1; i <= workers; ++i) {
    cluster->workers_.push_back(*std::move(nodes[i]));
    out = cluster->coordinator_->Psql(
        absl::StrCat("SELECT citus_add_node('127.0.0.1', ",
                     cluster->workers_.back()->port(), ")"));
    if (!out.ok()) return out.status();
  }
  return cluster;
}

absl::StatusOr<int> CitusCluster::AddWorker() {
  absl::StatusOr<std::unique_ptr<PgCluster>> node = StartNode();
  if (!node.ok()) return node.status();
  absl::StatusOr<std::string> out = coordinator_->Psql(absl::StrCat(
      "SELECT citus_add_node('127.0.0.1', ", (*node)->port(), ")"));
  if (!out.ok()) return out.status();
  workers_.push_back(*std::move(node));
  return workers() - 1;
}

}  // namespace idem::testing
