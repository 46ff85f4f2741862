#ifndef IDEM_TESTS_TESTING_CITUS_CLUSTER_H_
#define IDEM_TESTS_TESTING_CITUS_CLUSTER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tests/testing/pg_cluster.h"

namespace idem::testing {

// Whether the environment asks for the PostgreSQL store's tests to run on a
// Citus cluster (IDEM_TEST_CITUS=1; CTest's *_citus entries).
bool UseCitus();

// OK when Citus can run here: citus.so is installed beside the PostgreSQL
// that PgCluster starts. Otherwise FAILED_PRECONDITION saying what is
// missing and how to install it.
absl::Status CitusAvailable();

// Whether a missing Citus fails the Citus tests rather than skipping them:
// under CI (CI=true), where the test machine is set up to have it.
bool CitusRequired();

// In a test body: where Citus cannot run here, the test says why and skips;
// under CI (CitusRequired) it fails instead.
#define IDEM_REQUIRE_CITUS()                                           \
  do {                                                                 \
    const absl::Status idem_citus = ::idem::testing::CitusAvailable(); \
    if (!idem_citus.ok()) {                                            \
      if (::idem::testing::CitusRequired()) {                          \
        FAIL() << idem_citus.message() << " (CI=true)";                \
      }                                                                \
      GTEST_SKIP() << "skipped (Citus): " << idem_citus.message();     \
    }                                                                  \
  } while (0)

// A throwaway Citus cluster on this machine: a coordinator and workers, each
// a PgCluster (its own data directory and free port on 127.0.0.1) that
// preloads Citus and has the extension created; the coordinator knows
// itself (citus_set_coordinator_host, no shards) and every worker
// (citus_add_node). Clients connect to the coordinator. Not thread-safe.
class CitusCluster {
 public:
  // Starts the coordinator and `workers` workers (at once) and joins them.
  // The error carries the failing node's log.
  static absl::StatusOr<std::unique_ptr<CitusCluster>> Start(int workers = 2);

  CitusCluster(const CitusCluster&) = delete;
  CitusCluster& operator=(const CitusCluster&) = delete;
  // Stops every node and removes their directories.
  ~CitusCluster() = default;

  PgCluster& coordinator() { return *coordinator_; }
  const PgCluster& coordinator() const { return *coordinator_; }
  int workers() const { return static_cast<int>(workers_.size()); }
  PgCluster& worker(int i) { return *workers_[i]; }

  // The coordinator's conninfo (PgCluster::ConnInfo).
  std::string ConnInfo(const std::string& dbname = "postgres") const {
    return coordinator_->ConnInfo(dbname);
  }

  // Starts one more worker and adds it with citus_add_node (it holds no
  // shard until they are moved or rebalanced); returns its index.
  absl::StatusOr<int> AddWorker();

 private:
  CitusCluster() = default;

  std::unique_ptr<PgCluster> coordinator_;
  std::vector<std::unique_ptr<PgCluster>> workers_;
};

}  // namespace idem::testing

#endif  // IDEM_TESTS_TESTING_CITUS_CLUSTER_H_
