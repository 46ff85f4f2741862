#include "tests/faults/scenarios.h"

#include <hiredis/hiredis.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "tests/faults/cluster.h"
#include "tests/faults/workload.h"
#include "tests/testing/citus_cluster.h"
#include "tests/testing/files.h"
#include "tests/testing/patroni_cluster.h"
#include "tests/testing/process.h"

namespace idem::faults {
namespace {

std::atomic<bool> g_abort{false};

// The nemesis of one scenario: its random schedule, the cluster it hurts,
// and what it did.
class Nemesis {
 public:
  Nemesis(Cluster& cluster, Shared& shared, uint64_t seed, absl::Time end)
      : cluster_(cluster), shared_(shared), rng_(seed), end_(end) {}

  Cluster& cluster() { return cluster_; }
  Shared& shared() { return shared_; }
  std::mt19937_64& rng() { return rng_; }
  int64_t faults() const { return faults_; }
  void AddFaults(int64_t n) { faults_ += n; }
  const std::vector<std::string>& log() const { return log_; }
  // Operations made outside the workload (the holder process').
  std::vector<Op>& extra_ops() { return extra_ops_; }
  absl::Time end() const { return end_; }

  bool Running() const { return absl::Now() < end_ && !AbortRequested(); }

  // Sleeps `d`, but not past the end; false when the end has come.
  bool Sleep(absl::Duration d) {
    const absl::Time until = std::min(absl::Now() + d, end_);
    while (Running() && absl::Now() < until) {
      absl::SleepFor(std::min(absl::Milliseconds(100), until - absl::Now()));
    }
    return Running();
  }

  absl::Duration Between(double lo_s, double hi_s) {
    return absl::Milliseconds(std::uniform_int_distribution<int64_t>(
        static_cast<int64_t>(lo_s * 1000),
        static_cast<int64_t>(hi_s * 1000))(rng_));
  }
  int Index(int n) {
    return static_cast<int>(std::uniform_int_distribution<int>(0, n - 1)(rng_));
  }
  double Unit() { return std::uniform_real_distribution<double>(0, 1)(rng_); }

  // Records a fault (counted) or a note (not counted).
  void Fault(const std::string& what) {
    ++faults_;
    Note(what);
  }
  void Note(const std::string& what) {
    log_.push_back(absl::StrCat(absl::ToInt64Milliseconds(absl::Now() - start_),
                                "ms ", what));
  }
  void Check(const absl::Status& s, const std::string& what) {
    if (!s.ok()) Note(absl::StrCat(what, " failed: ", s.message()));
  }
  // Fails the scenario whatever the checker finds.
  void Fail(const std::string& why) {
    Note("FAIL: " + why);
    if (error_.empty()) error_ = why;
  }
  const std::string& error() const { return error_; }

 private:
  Cluster& cluster_;
  Shared& shared_;
  std::mt19937_64 rng_;
  const absl::Time end_;
  const absl::Time start_ = absl::Now();
  int64_t faults_ = 0;
  std::vector<std::string> log_;
  std::vector<Op> extra_ops_;
  std::string error_;
};

struct Scenario {
  std::string name;
  std::string description;
  // Adjusts the cluster and workload before the start.
  std::function<void(ClusterOptions&, WorkloadOptions&)> setup;
  // Injects faults until nemesis.end().
  std::function<void(Nemesis&, const ScenarioConfig&)> run;
};

void SidecarKill(Nemesis& n, const ScenarioConfig&) {
  Cluster& c = n.cluster();
  while (n.Sleep(n.Between(0.7, 2.5))) {
    std::vector<int> victims = {n.Index(c.size())};
    if (n.Unit() < 0.2) victims.push_back((victims[0] + 1) % c.size());
    for (int i : victims) {
      n.Check(c.sidecar(i).Kill(), "kill");
      n.Fault(absl::StrCat("SIGKILL sidecar ", i));
    }
    absl::SleepFor(n.Between(0, 1.5));
    for (int i : victims) n.Check(c.RestartSidecar(i), "restart sidecar");
  }
}

void PgCrash(Nemesis& n, const ScenarioConfig&) {
  Cluster& c = n.cluster();
  while (n.Sleep(n.Between(1.5, 3.5))) {
    n.Check(c.Primary().StopImmediate(), "pg stop -m immediate");
    c.pg_stopped = true;
    n.Fault("PostgreSQL immediate shutdown");
    absl::SleepFor(n.Between(0.2, 2.0));
    absl::Status s = c.Primary().StartAgain();
    n.Check(s, "pg start");
    if (s.ok()) c.pg_stopped = false;
  }
}

void PgPause(Nemesis& n, const ScenarioConfig&) {
  Cluster& c = n.cluster();
  while (n.Sleep(n.Between(1.5, 3.0))) {
    // Longer than the workers' 3 s leases.
    const absl::Duration pause = n.Between(3.2, 5.0);
    n.Check(c.Primary().Pause(), "pg SIGSTOP");
    c.pg_paused = true;
    n.Fault(
        absl::StrCat("PostgreSQL SIGSTOP for ", absl::FormatDuration(pause)));
    absl::SleepFor(pause);
    n.Check(c.Primary().Resume(), "pg SIGCONT");
    c.pg_paused = false;
  }
}

void PgTerminate(Nemesis& n, const ScenarioConfig&) {
  Cluster& c = n.cluster();
  while (n.Sleep(n.Between(0.5, 2.0))) {
    const int sweeps = 3 + n.Index(6);
    for (int k = 0; k < sweeps && n.Running(); ++k) {
      absl::StatusOr<std::string> out = c.Primary().Psql(
          "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
          " WHERE application_name = 'idempotency-sidecar'",
          absl::Seconds(10));
      n.Fault(absl::StrCat(
          "pg_terminate_backend storm: ",
          out.ok() ? *out : std::string(out.status().message()), " backends"));
      absl::SleepFor(n.Between(0.02, 0.2));
    }
  }
}

// Returns the state letter of process `pid` from /proc (e.g. 'T' when
// stopped), or 0.
char ProcessState(pid_t pid) {
  std::string stat = testing::ReadFile(absl::StrCat("/proc/", pid, "/stat"));
  size_t close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return 0;
  return stat[close + 2];
}

void PausedHolder(Nemesis& n, const ScenarioConfig& config) {
  Cluster& c = n.cluster();
  absl::StatusOr<std::string> dir = testing::MakeTempDir("idem-holder-");
  if (!dir.ok()) {
    n.Note("no temp dir for the holder");
    return;
  }
  const std::string ops_path = *dir + "/holder.ops";
  const std::string log_path = *dir + "/holder.log";
  const int keys = std::max<int>(
      2, static_cast<int>(absl::ToInt64Seconds(config.duration) / 5));
  absl::StatusOr<std::unique_ptr<testing::Process>> holder =
      testing::Process::Spawn(
          {config.self_path, "--holder",
           "--addresses=" + absl::StrJoin(c.ClientAddresses(), ","),
           "--conninfo=" + c.DirectConnInfo(), "--out=" + ops_path,
           absl::StrCat("--keys=", keys), "--lease-ms=1000",
           absl::StrCat("--seed=", config.seed)},
          {}, log_path);
  if (!holder.ok()) {
    n.Note(absl::StrCat("holder did not start: ", holder.status().message()));
    testing::RemoveTempDir(*dir);
    return;
  }
  testing::Process& p = **holder;
  size_t seen_grants = 0;
  // Run past the nominal end until the holder is done (bounded).
  const absl::Time hard_end = n.end() + absl::Seconds(60);
  while ((*holder)->Running() && absl::Now() < hard_end && !AbortRequested()) {
    std::vector<std::string> grants;
    for (absl::string_view line : absl::StrSplit(p.Log(), '\n')) {
      if (absl::StartsWith(line, "GRANTED ")) grants.emplace_back(line);
    }
    const char state = ProcessState(p.pid());
    if (grants.size() > seen_grants && state == 'T') {
      seen_grants = grants.size();
      std::vector<std::string> f = absl::StrSplit(grants.back(), ' ');
      const std::string key = f.size() > 1 ? f[1] : "";
      // Paused past its 1 s lease while rivals Begin the same key; on
      // create-payment the record turns UNKNOWN and an operator resolves
      // it; on send-email the lease is released to the next Begin.
      n.shared().SetFocus({key});
      const absl::Duration pause = n.Between(2.5, 4.0);
      n.Fault(absl::StrCat("holder paused (SIGSTOP) after its grant of ", key,
                           " token ", f.size() > 2 ? f[2] : "?", " for ",
                           absl::FormatDuration(pause)));
      absl::SleepFor(pause);
      n.Check(p.Signal(SIGCONT), "SIGCONT holder");
      absl::SleepFor(absl::Milliseconds(500));
      n.shared().SetFocus({});
    } else if (state != 'T' && n.Unit() < 0.01) {
      // Also at a random moment (in a call, between calls).
      n.Check(p.Signal(SIGSTOP), "SIGSTOP holder");
      const absl::Duration pause = n.Between(1.2, 2.5);
      n.Fault(absl::StrCat("holder paused (SIGSTOP) at a random moment for ",
                           absl::FormatDuration(pause)));
      absl::SleepFor(pause);
      n.Check(p.Signal(SIGCONT), "SIGCONT holder");
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  if ((*holder)->Running()) {
    n.Note("holder did not finish in time; killed");
    p.Kill().IgnoreError();
  }
  std::ifstream in(ops_path);
  std::string line;
  while (std::getline(in, line)) {
    absl::StatusOr<Op> op = ParseOp(line);
    if (op.ok()) {
      n.extra_ops().push_back(*std::move(op));
    } else {
      n.Note(std::string(op.status().message()));
    }
  }
  n.Note(
      absl::StrCat("holder: ", n.extra_ops().size(), " ops, log:\n", p.Log()));
  holder->reset();
  testing::RemoveTempDir(*dir);
  // Let the workload run on to the nominal end.
  while (n.Sleep(absl::Milliseconds(200))) {
  }
}

// How long a sidecar may take to serve again once the standby is promoted
// (measured: docs/operations.md#postgresql-failover), and then to answer
// health SERVING (its monitor pings once a second) and to listen again.
constexpr absl::Duration kServeAgainWithin = absl::Seconds(10);
constexpr absl::Duration kHealthyAgainWithin = absl::Seconds(30);

// Whether sidecar `address` grants a new key now: a Begin of a tenant the
// checker does not look at.
bool GrantsANewKey(const std::string& address, int64_t n) {
  auto stub = pb::Idempotency::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  pb::BeginRequest req;
  req.mutable_key()->set_tenant("failover-probe");
  req.mutable_key()->set_operation("probe");
  req.mutable_key()->set_key(absl::StrCat(address, "-", n));
  req.set_request_hash("probe");
  pb::BeginResponse resp;
  return stub->Begin(&ctx, req, &resp).ok() &&
         resp.outcome() == pb::OUTCOME_ACQUIRED;
}

// Waits until every sidecar grants a new key (within kServeAgainWithin of
// `promoted`), then answers health SERVING and has its change-feed listener
// back; notes each sidecar's times after the promotion and after `killed`
// (the primary's death). Fails the scenario and returns false otherwise.
bool EverySidecarServesAgain(Nemesis& n, absl::Time killed,
                             absl::Time promoted) {
  Cluster& c = n.cluster();
  auto since = [&] {
    const absl::Time now = absl::Now();
    return absl::StrCat(
        absl::ToInt64Milliseconds(now - promoted), " ms after the promotion (",
        absl::ToInt64Milliseconds(now - killed), " ms after the kill)");
  };
  int64_t probes = 0;
  for (int i = 0; i < c.size(); ++i) {
    const std::string address = c.sidecar(i).Address();
    while (!GrantsANewKey(address, ++probes)) {
      if (absl::Now() - promoted > kServeAgainWithin) {
        n.Fail(absl::StrCat("sidecar ", i, " did not serve within ",
                            absl::FormatDuration(kServeAgainWithin),
                            " of the promotion"));
        return false;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    n.Note(absl::StrCat("sidecar ", i, " serves again ", since()));
  }
  // The health monitor and the change-feed listener found the new primary
  // too (waiters would otherwise poll).
  for (int i = 0; i < c.size(); ++i) {
    if (!WaitServing(c.sidecar(i).Address(), kHealthyAgainWithin)) {
      n.Fail(absl::StrCat("sidecar ", i, " not SERVING after the failover"));
      return false;
    }
    n.Note(absl::StrCat("sidecar ", i, " SERVING ", since()));
    const absl::Time until = absl::Now() + kHealthyAgainWithin;
    while (!absl::StrContains(c.sidecar(i).Log(),
                              "record change listener is back")) {
      if (absl::Now() > until) {
        n.Fail(absl::StrCat("sidecar ", i,
                            "'s change-feed listener did not "
                            "come back after the failover"));
        return false;
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
  }
  n.Note("every sidecar SERVING and listening again " + since());
  return true;
}

void PgFailover(Nemesis& n, const ScenarioConfig&) {
  Cluster& c = n.cluster();
  if (!n.Sleep(n.Between(2.0, 4.0))) return;
  const absl::Time killed = absl::Now();
  const absl::Duration detection = n.Between(0.2, 1.0);
  absl::Status s = c.FailOver(detection);
  n.Fault(absl::StrCat("SIGKILL of the primary; standby promoted ",
                       absl::FormatDuration(detection), " later"));
  if (!s.ok()) {
    n.Fail(absl::StrCat("failover: ", s.message()));
    return;
  }
  const absl::Time promoted = absl::Now();
  n.Note(absl::StrCat("standby promoted after ",
                      absl::FormatDuration(promoted - killed)));
  if (!EverySidecarServesAgain(n, killed, promoted)) return;
  while (n.Sleep(absl::Milliseconds(200))) {
  }
}

// How long Patroni may take to hand the leader lock to the synchronous
// standby once the leader is killed: the lock's TTL (10 s) runs out, then a
// loop of the standby; twice that leaves room for a loaded 2-core machine.
constexpr absl::Duration kPromotedWithin = absl::Seconds(40);
// The workload goes on this long at least after every sidecar serves again,
// however short the run.
constexpr absl::Duration kServeAfterFailover = absl::Seconds(5);

void PatroniFailover(Nemesis& n, const ScenarioConfig&) {
  Cluster& c = n.cluster();
  testing::PatroniCluster& p = c.patroni();
  if (!n.Sleep(n.Between(2.0, 4.0))) return;
  // Healthy at start-up; checked again in case Patroni moved the roles
  // since (it should not, but a store that stalls past retry_timeout would).
  absl::Status s = p.WaitHealthy(absl::Seconds(30));
  absl::StatusOr<int> leader = p.Leader();
  if (s.ok()) s = leader.status();
  absl::StatusOr<int> sync = p.SyncStandby();
  if (s.ok()) s = sync.status();
  if (!s.ok()) {
    n.Fail(absl::StrCat("before the kill: ", s.message()));
    return;
  }
  const absl::Time killed = absl::Now();
  s = p.KillNode(*leader);
  c.failed_over = true;
  n.Fault(absl::StrCat("SIGKILL of node", *leader,
                       " (the leader): its Patroni and its PostgreSQL; node",
                       *sync, " is the synchronous standby"));
  if (!s.ok()) {
    n.Fail(absl::StrCat("kill: ", s.message()));
    return;
  }
  absl::StatusOr<int> promoted_node = p.Leader();
  while (!promoted_node.ok()) {
    if (absl::Now() - killed > kPromotedWithin || AbortRequested()) {
      n.Fail(absl::StrCat("no node took the leader lock within ",
                          absl::FormatDuration(kPromotedWithin),
                          " of the kill"));
      return;
    }
    absl::SleepFor(absl::Milliseconds(50));
    promoted_node = p.Leader();
  }
  const absl::Time promoted = absl::Now();
  if (*promoted_node != *sync) {
    n.Fail(absl::StrCat("Patroni promoted node", *promoted_node,
                        ", not the synchronous standby node", *sync));
    return;
  }
  n.Note(absl::StrCat("node", *sync, " took the leader lock ",
                      absl::ToInt64Milliseconds(promoted - killed),
                      " ms after the kill"));
  if (!EverySidecarServesAgain(n, killed, promoted)) return;
  // Until the remaining replica follows the new leader, its commits are
  // on one server (Patroni clears synchronous_standby_names on promotion).
  s = p.WaitHealthy(absl::Seconds(60));
  if (!s.ok()) {
    n.Fail(absl::StrCat("after the failover: ", s.message()));
    return;
  }
  n.Note(absl::StrCat("a synchronous standby streams from the new leader ",
                      absl::ToInt64Milliseconds(absl::Now() - killed),
                      " ms after the kill"));
  const absl::Time until = std::max(n.end(), absl::Now() + kServeAfterFailover);
  while (absl::Now() < until && !AbortRequested()) {
    absl::SleepFor(absl::Milliseconds(100));
  }
}

// A waiter is woken when the record it waits on settles: within this long
// of the acknowledged Complete (a missed wake shows as the whole wait).
// Measured: 48-399 ms at worst per run on a loaded 2-core VM; the rest is
// room for a sanitizer build.
constexpr absl::Duration kWakeWithin = absl::Seconds(4);
constexpr int64_t kWaitMs = 8000;

// Pairs of callers on fresh keys of the workload's tenant, one pair at a
// time: a holder Begins, a rival's waiting Begin (kWaitMs) parks on the
// record on some sidecar, the holder writes its effect and Completes; the
// rival must be answered within kWakeWithin of the acknowledged Complete.
// Its ops join the history.
class WaiterProbe {
 public:
  WaiterProbe(const std::vector<std::string>& addresses,
              const std::string& conninfo, uint64_t seed)
      : holder_(addresses, 2000, &recorder_, absl::Seconds(2), seed),
        waiter_(addresses, 2001, &recorder_,
                absl::Milliseconds(kWaitMs) + absl::Seconds(2), seed + 1),
        ledger_(conninfo, &recorder_),
        thread_([this, seed] { Loop(seed); }) {}
  ~WaiterProbe() { Stop(); }

  void Stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  // After Stop(): the pairs whose Complete was acknowledged, the waiters
  // not answered in time (each described), the slowest wake.
  int64_t judged() const { return judged_; }
  const std::vector<std::string>& late() const { return late_; }
  absl::Duration slowest() const { return slowest_; }
  std::vector<Op> TakeOps() { return recorder_.Take(); }

 private:
  void Loop(uint64_t seed) {
    for (int64_t n = 0; !stop_.load() && !AbortRequested(); ++n) {
      Pair(absl::StrCat("create-payment/waited-", seed, "-", n));
      absl::SleepFor(absl::Milliseconds(100));
    }
  }

  void Pair(const std::string& key) {
    const std::string hash = IntentHash(key);
    Op grant;
    for (int i = 0; i < 20; ++i) {
      grant = holder_.Begin(key, hash, key + "-holder", 10000);
      if (grant.result != Result::kInfo) break;
      absl::SleepFor(absl::Milliseconds(100));
    }
    if (grant.result != Result::kOk || grant.outcome != pb::OUTCOME_ACQUIRED) {
      return;
    }
    std::atomic<int64_t> answered_ns{0};
    Op answer;
    std::thread rival([&] {
      const int64_t give_up = NowNs() + 2 * kWaitMs * 1000000;
      do {
        answer = waiter_.Begin(key, hash, key + "-waiter", 10000, kWaitMs);
      } while (answer.result == Result::kInfo && NowNs() < give_up);
      answered_ns.store(NowNs());
    });
    // The rival parks before the holder settles.
    absl::SleepFor(absl::Milliseconds(300));
    const int64_t token = grant.granted_token;
    Op effect = ledger_.Write(key, token, "w2000", 2000);
    Op done;
    if (effect.result == Result::kOk) {
      std::mt19937_64 rng(token);
      const pb::Snapshot result =
          TaggedSnapshot({key, token, "w2000"}, 201, rng());
      const int64_t give_up = NowNs() + 10'000'000'000;
      do {
        done = holder_.Complete(key, token, result);
      } while (done.result == Result::kInfo && NowNs() < give_up);
    }
    const int64_t acked_ns = NowNs();
    rival.join();
    if (done.result != Result::kOk) return;
    ++judged_;
    const absl::Duration wake =
        absl::Nanoseconds(std::max<int64_t>(0, answered_ns.load() - acked_ns));
    slowest_ = std::max(slowest_, wake);
    if (wake > kWakeWithin || answer.result != Result::kOk ||
        answer.outcome == pb::OUTCOME_IN_PROGRESS) {
      late_.push_back(
          absl::StrCat(key, ": answered ", absl::FormatDuration(wake),
                       " after the Complete, ", DescribeOp(answer)));
    }
  }

  Recorder recorder_{/*first_id=*/2000000000};
  Client holder_;
  Client waiter_;
  Ledger ledger_;
  std::atomic<bool> stop_{false};
  int64_t judged_ = 0;
  std::vector<std::string> late_;
  absl::Duration slowest_;
  std::thread thread_;
};

// The workload runs on this long at least after the last shard move.
constexpr absl::Duration kServeAfterMoves = absl::Seconds(3);

void CitusRebalance(Nemesis& n, const ScenarioConfig& config) {
  Cluster& c = n.cluster();
  testing::CitusCluster& citus = c.citus();
  WaiterProbe probe(c.ClientAddresses(), c.DirectConnInfo(), config.seed);
  auto finish = [&] {
    probe.Stop();
    for (Op& op : probe.TakeOps()) n.extra_ops().push_back(std::move(op));
    n.Note(absl::StrCat(probe.judged(), " waiters judged, slowest woken ",
                        absl::FormatDuration(probe.slowest()),
                        " after the Complete"));
    if (probe.judged() == 0) n.Fail("no waiter's holder Completed");
    for (const std::string& late : probe.late()) {
      n.Fail("waiter not woken in time: " + late);
    }
  };
  // Runs `query` on the coordinator; a move counts as a fault, a read is
  // a note.
  auto sql = [&](const std::string& what, const std::string& query,
                 std::string* out) {
    const absl::Time start = absl::Now();
    absl::StatusOr<std::string> r =
        citus.coordinator().Psql(query, absl::Seconds(120));
    if (!r.ok()) {
      n.Fail(absl::StrCat(what, ": ", r.status().message()));
      return false;
    }
    const std::string line = absl::StrCat(
        what, " in ", absl::ToInt64Milliseconds(absl::Now() - start), " ms");
    if (out != nullptr) {
      *out = *r;
      n.Note(line);
    } else {
      n.Fault(line);
    }
    return true;
  };
  if (!n.Sleep(n.Between(2.0, 3.0))) return finish();
  const absl::Time start = absl::Now();
  absl::StatusOr<int> added = citus.AddWorker();
  if (!added.ok()) {
    n.Fail(absl::StrCat("adding a worker: ", added.status().message()));
    return finish();
  }
  const std::string to = std::to_string(citus.worker(*added).port());
  n.Fault(absl::StrCat("worker on port ", to, " added (citus_add_node) in ",
                       absl::ToInt64Milliseconds(absl::Now() - start), " ms"));
  // The workload's tenant lives on one shard group (record and audit
  // shards, co-located): moved onto the new worker first, by logical
  // replication while it takes writes.
  const std::string shard = absl::StrCat(
      "get_shard_id_for_distribution_column('idempotency_record', '", kTenant,
      "')");
  std::string from;
  if (!sql("the tenant's shard located",
           "SELECT nodeport FROM citus_shards WHERE shardid = " + shard,
           &from) ||
      !sql(absl::StrCat("the tenant's shard group moved from port ", from,
                        " to ", to, " (citus_move_shard_placement)"),
           absl::StrCat("SELECT citus_move_shard_placement(", shard,
                        ", '127.0.0.1', ", from, ", '127.0.0.1', ", to,
                        ", 'force_logical')"),
           nullptr) ||
      // Two statements (psql -c would run them in one transaction, where
      // the job's tasks are not yet visible to Citus' executors).
      !sql("the rest scheduled (citus_rebalance_start)",
           "SELECT citus_rebalance_start(shard_transfer_mode =>"
           " 'force_logical')",
           nullptr) ||
      !sql("the rest rebalanced (citus_rebalance_wait)",
           "SELECT citus_rebalance_wait()", nullptr)) {
    return finish();
  }
  std::string placed;
  std::string spread;
  if (sql("placements read",
          "SELECT nodeport FROM citus_shards WHERE shardid = " + shard,
          &placed) &&
      sql("shards per node read",
          "SELECT string_agg(nodeport || ':' || n, ' ' ORDER BY nodeport)"
          " FROM (SELECT nodeport, count(*) n FROM citus_shards"
          " GROUP BY nodeport) s",
          &spread)) {
    n.Note(absl::StrCat("shards per port after the moves: ", spread));
    if (placed != to) {
      n.Fail(absl::StrCat("the tenant's shard is on port ", placed,
                          ", not on the new worker ", to));
    }
  }
  const absl::Time until = std::max(n.end(), absl::Now() + kServeAfterMoves);
  while (absl::Now() < until && !AbortRequested()) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  finish();
}

void CommitCut(Nemesis& n, const ScenarioConfig&) {
  Cluster& c = n.cluster();
  while (n.Sleep(n.Between(0.2, 0.8))) {
    const int i = n.Index(c.size());
    const double r = n.Unit();
    // Down: the reply (CommandComplete / ReadyForQuery) is cut after the
    // server committed; up: the statement itself is cut.
    const Direction d = r < 0.6 ? Direction::kDown
                                : (r < 0.9 ? Direction::kUp : Direction::kBoth);
    const int64_t bytes = 1 + n.Index(600);
    const int count = 1 + n.Index(3);
    c.pg_proxy(i).ArmCut(d, bytes, count);
    n.Note(absl::StrCat("armed cut of ", count, " connection(s) of sidecar ", i,
                        " after ", bytes, " bytes ", DirectionName(d)));
    absl::SleepFor(absl::Milliseconds(400));
    c.pg_proxy(i).DisarmCut();
  }
  int64_t cuts = 0;
  for (int i = 0; i < c.size(); ++i) cuts += c.pg_proxy(i).stats().cuts;
  n.AddFaults(cuts);
  n.Note(absl::StrCat(cuts, " connections cut mid-statement"));
}

void PgPartition(Nemesis& n, const ScenarioConfig&) {
  Cluster& c = n.cluster();
  while (n.Sleep(n.Between(0.5, 2.0))) {
    const int i = n.Index(c.size());
    FaultProxy& p = c.pg_proxy(i);
    const double r = n.Unit();
    if (r < 0.45) {
      const absl::Duration d = n.Between(0.5, 4.0);
      p.SetBlackhole(true);
      n.Fault(absl::StrCat("black hole sidecar ", i, " -> PostgreSQL for ",
                           absl::FormatDuration(d)));
      absl::SleepFor(d);
      p.SetBlackhole(false);
    } else if (r < 0.75) {
      const absl::Duration delay = n.Between(0.05, 0.6);
      const absl::Duration d = n.Between(1.0, 3.0);
      p.SetDelay(delay);
      n.Fault(absl::StrCat("delay sidecar ", i, " -> PostgreSQL by ",
                           absl::FormatDuration(delay), " for ",
                           absl::FormatDuration(d)));
      absl::SleepFor(d);
      p.SetDelay(absl::ZeroDuration());
    } else {
      p.ResetAll();
      n.Fault(absl::StrCat("reset every PostgreSQL connection of sidecar ", i));
    }
  }
}

// Runs one Redis command with binary-safe arguments; returns the reply
// string (empty on error or nil).
std::string RedisCall(redisContext* r, const std::vector<std::string>& args) {
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (const std::string& a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  auto* reply = static_cast<redisReply*>(redisCommandArgv(
      r, static_cast<int>(args.size()), argv.data(), lens.data()));
  std::string out;
  if (reply != nullptr && reply->type == REDIS_REPLY_STRING) {
    out.assign(reply->str, reply->len);
  }
  if (reply != nullptr) freeReplyObject(reply);
  return out;
}

// Overwrites up to 20 idem:* entries: garbage (with redis-cli), a truncated
// value, or another record's value.
void CorruptRedis(Nemesis& n) {
  Cluster& c = n.cluster();
  timeval tv{2, 0};
  redisContext* r = redisConnectWithTimeout("127.0.0.1", c.redis().port(), tv);
  if (r == nullptr || r->err) {
    if (r != nullptr) redisFree(r);
    return;
  }
  redisSetTimeout(r, tv);
  std::vector<std::string> keys;
  auto* reply = static_cast<redisReply*>(
      redisCommand(r, "SCAN 0 MATCH idem:* COUNT 200"));
  if (reply != nullptr && reply->type == REDIS_REPLY_ARRAY &&
      reply->elements == 2) {
    for (size_t i = 0; i < reply->element[1]->elements && keys.size() < 20;
         ++i) {
      keys.emplace_back(reply->element[1]->element[i]->str,
                        reply->element[1]->element[i]->len);
    }
  }
  if (reply != nullptr) freeReplyObject(reply);
  int corrupted = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    const double u = n.Unit();
    if (u < 0.4) {
      std::string garbage = absl::StrCat("IDC2garbage-", n.Index(1 << 30));
      if (n.Unit() < 0.5) garbage = "not a record at all";
      if (c.redis().Cli("SET", keys[i], garbage).ok()) ++corrupted;
    } else if (u < 0.7) {
      std::string v = RedisCall(r, {"GET", keys[i]});
      if (v.size() > 8) {
        RedisCall(r, {"SET", keys[i],
                      v.substr(0, 8 + n.Index(static_cast<int>(v.size() - 8))),
                      "PX", "600000"});
        ++corrupted;
      }
    } else if (keys.size() > 1) {
      const std::string& other = keys[(i + 1) % keys.size()];
      std::string v = RedisCall(r, {"GET", other});
      if (!v.empty()) {
        RedisCall(r, {"SET", keys[i], v, "PX", "600000"});
        ++corrupted;
      }
    }
  }
  redisFree(r);
  n.Fault(absl::StrCat("corrupted ", corrupted, " Redis values"));
}

void RedisChaos(Nemesis& n, const ScenarioConfig&) {
  Cluster& c = n.cluster();
  while (n.Sleep(n.Between(0.5, 1.8))) {
    const double r = n.Unit();
    if (r < 0.2) {
      n.Check(c.redis().Kill(), "redis kill");
      c.redis_killed = true;
      n.Fault("Redis SIGKILL");
      absl::SleepFor(n.Between(0.2, 1.5));
      absl::Status s = c.redis().StartAgain();
      n.Check(s, "redis restart");
      if (s.ok()) c.redis_killed = false;
    } else if (r < 0.4) {
      const absl::Duration d = n.Between(0.3, 1.5);
      n.Check(c.redis().Pause(), "redis SIGSTOP");
      c.redis_paused = true;
      n.Fault(absl::StrCat("Redis SIGSTOP for ", absl::FormatDuration(d)));
      absl::SleepFor(d);
      n.Check(c.redis().Resume(), "redis SIGCONT");
      c.redis_paused = false;
    } else if (r < 0.55) {
      n.Check(c.redis().Cli("FLUSHALL").status(), "FLUSHALL");
      n.Fault("Redis FLUSHALL");
    } else if (r < 0.85) {
      CorruptRedis(n);
    } else {
      const int i = n.Index(c.size());
      const absl::Duration d = n.Between(0.3, 2.0);
      c.redis_proxy(i).SetBlackhole(true);
      n.Fault(absl::StrCat("black hole sidecar ", i, " -> Redis for ",
                           absl::FormatDuration(d)));
      absl::SleepFor(d);
      c.redis_proxy(i).SetBlackhole(false);
      c.redis_proxy(i).ResetAll();
    }
  }
}

void ClockSkew(Nemesis& n, const ScenarioConfig&) {
  Cluster& c = n.cluster();
  static const char* const kOffsets[] = {"+1h", "-1h", "+5m", "-5m",
                                         "+1d", "-2h", ""};
  for (int i = 0; i < c.size(); ++i) {
    if (!c.clock_offset(i).empty()) {
      n.Fault(absl::StrCat("sidecar ", i, " clock ", c.clock_offset(i)));
    }
  }
  while (n.Sleep(n.Between(3.0, 6.0))) {
    const int i = n.Index(c.size());
    const std::string offset = kOffsets[n.Index(7)];
    absl::Status s = c.RestartSidecarWithClock(i, offset);
    n.Check(s, "restart under faketime");
    if (!offset.empty()) {
      n.Fault(absl::StrCat("sidecar ", i, " restarted with clock ", offset));
    } else {
      n.Note(absl::StrCat("sidecar ", i, " restarted with the real clock"));
    }
  }
}

void ResolveRace(Nemesis& n, const ScenarioConfig&) {
  // The workload does the racing (three operators that disagree, workers
  // chasing UNKNOWN records); now and then one sidecar is killed mid-way.
  Cluster& c = n.cluster();
  while (n.Sleep(n.Between(3.0, 6.0))) {
    const int i = n.Index(c.size());
    n.Check(c.sidecar(i).Kill(), "kill");
    n.Fault(absl::StrCat("SIGKILL sidecar ", i));
    absl::SleepFor(n.Between(0.1, 0.8));
    n.Check(c.RestartSidecar(i), "restart sidecar");
  }
}

void ClientNet(Nemesis& n, const ScenarioConfig&) {
  Cluster& c = n.cluster();
  while (n.Sleep(n.Between(0.4, 1.8))) {
    const int i = n.Index(c.size());
    FaultProxy& p = c.client_proxy(i);
    const double r = n.Unit();
    if (r < 0.4) {
      p.ResetAll();
      n.Fault(absl::StrCat("reset every client connection to sidecar ", i));
    } else if (r < 0.65) {
      const absl::Duration d = n.Between(0.5, 3.0);
      p.SetBlackhole(true);
      n.Fault(absl::StrCat("black hole clients -> sidecar ", i, " for ",
                           absl::FormatDuration(d)));
      absl::SleepFor(d);
      p.SetBlackhole(false);
    } else if (r < 0.85) {
      const absl::Duration delay = n.Between(0.1, 2.5);
      const absl::Duration d = n.Between(1.0, 3.0);
      p.SetDelay(delay);
      n.Fault(absl::StrCat("delay clients -> sidecar ", i, " by ",
                           absl::FormatDuration(delay), " for ",
                           absl::FormatDuration(d)));
      absl::SleepFor(d);
      p.SetDelay(absl::ZeroDuration());
    } else {
      const absl::Duration d = n.Between(0.5, 2.0);
      p.SetRefuse(true);
      p.ResetAll();
      n.Fault(absl::StrCat("refuse and reset clients of sidecar ", i, " for ",
                           absl::FormatDuration(d)));
      absl::SleepFor(d);
      p.SetRefuse(false);
    }
  }
}

const std::vector<Scenario>& Scenarios() {
  static const auto* scenarios = new std::vector<Scenario>{
      {"sidecar-kill",
       "SIGKILL one or two sidecars at random moments, restart them", nullptr,
       SidecarKill},
      {"pg-crash", "PostgreSQL immediate shutdown (crash), then restart",
       nullptr, PgCrash},
      {"pg-pause",
       "PostgreSQL SIGSTOPped for 3.2-5 s, longer than the 3 s leases", nullptr,
       PgPause},
      {"pg-terminate",
       "storms of pg_terminate_backend on every sidecar backend (psql)",
       nullptr, PgTerminate},
      {"paused-holder",
       "a holder process SIGSTOPped past its lease while rivals Begin; its "
       "late effect is fenced off and its stale Complete refused",
       [](ClusterOptions&, WorkloadOptions& w) { w.p_focus = 0.5; },
       PausedHolder},
      {"commit-cut",
       "sidecar-PostgreSQL connections cut after N bytes (mid-statement, "
       "mid-reply after COMMIT)",
       nullptr, CommitCut},
      {"pg-partition",
       "one sidecar's PostgreSQL link black-holed, delayed or reset", nullptr,
       PgPartition},
      {"redis-chaos",
       "Redis killed, paused, flushed, values corrupted (garbage, "
       "truncated, another record's), links black-holed",
       nullptr, RedisChaos},
      {"clock-skew",
       "sidecars under faketime (+1h, -1h, +1d, ...), restarted with new "
       "skews; must change nothing",
       [](ClusterOptions& c, WorkloadOptions& w) {
         c.clock_offsets = {"", "+1h", "-1h"};
         w.lease_ms = 2000;
         w.p_abandon = 0.1;
       },
       ClockSkew},
      {"resolve-race",
       "three disagreeing operators Resolve UNKNOWN records while workers "
       "Begin them; occasional sidecar kills",
       [](ClusterOptions&, WorkloadOptions& w) {
         w.operators = 3;
         w.p_abandon = 0.3;
         w.p_chase = 0.3;
         w.operator_follow_ledger = 0.3;
         w.operator_interval = absl::Milliseconds(150);
       },
       ResolveRace},
      {"pg-failover",
       "PostgreSQL with a synchronous standby: the primary SIGKILLed, the "
       "standby promoted; sidecars must serve again within 10 s and lose "
       "nothing acknowledged",
       [](ClusterOptions& c, WorkloadOptions&) { c.standby = true; },
       PgFailover},
      {"patroni-failover",
       "three PostgreSQL nodes under Patroni and etcd (synchronous_mode): "
       "the leader's Patroni and PostgreSQL SIGKILLed; Patroni must promote "
       "the synchronous standby, sidecars serve again without a restart and "
       "lose nothing acknowledged",
       [](ClusterOptions& c, WorkloadOptions&) { c.patroni = true; },
       PatroniFailover},
      {"citus-rebalance",
       "a Citus coordinator and two workers (tables distributed by "
       "--migrate): a third worker added, the workload's shard moved onto "
       "it and the rest rebalanced, by logical replication while serving; "
       "waiting Begins must still be woken",
       [](ClusterOptions& c, WorkloadOptions&) { c.citus = true; },
       CitusRebalance},
      {"client-net",
       "client-sidecar links reset, black-holed, delayed past deadlines, "
       "refused",
       nullptr, ClientNet},
  };
  return *scenarios;
}

}  // namespace

void RequestAbort() { g_abort.store(true); }

bool AbortRequested() { return g_abort.load(); }

std::vector<std::string> ScenarioNames() {
  std::vector<std::string> names;
  for (const Scenario& s : Scenarios()) names.push_back(s.name);
  return names;
}

std::string ScenarioDescription(const std::string& name) {
  for (const Scenario& s : Scenarios()) {
    if (s.name == name) return s.description;
  }
  return "";
}

ScenarioResult RunScenario(const ScenarioConfig& config) {
  ScenarioResult result;
  result.name = config.name;
  result.seed = config.seed;
  const absl::Time start = absl::Now();
  const Scenario* scenario = nullptr;
  for (const Scenario& s : Scenarios()) {
    if (s.name == config.name) scenario = &s;
  }
  if (scenario == nullptr) {
    result.error = "unknown scenario " + config.name;
    return result;
  }
  // The scenario's own stream of randomness: same seed, same schedule.
  const uint64_t seed = config.seed ^ (std::hash<std::string>()(config.name) *
                                       0x9E3779B97F4A7C15ull);
  ClusterOptions cluster_options;
  cluster_options.sidecar_path = config.sidecar_path;
  cluster_options.extra_args = config.sidecar_args;
  WorkloadOptions workload_options;
  workload_options.workers = config.workers;
  if (scenario->setup) scenario->setup(cluster_options, workload_options);
  // IDEM_TEST_CITUS=1 (CTest's faults_quick_citus): the database is a Citus
  // coordinator and two workers instead of one server; the PostgreSQL
  // faults hit the coordinator.
  if (testing::UseCitus() && !cluster_options.patroni) {
    if (cluster_options.standby) {
      result.skipped =
          "on Citus (IDEM_TEST_CITUS=1) there is no standby to promote: a "
          "coordinator's failover needs a standby of every node and its own "
          "entry in Citus' metadata moved, which this suite does not set "
          "up; pg-crash kills the coordinator instead";
      return result;
    }
    cluster_options.citus = true;
  }
  if (cluster_options.citus) {
    absl::Status citus = testing::CitusAvailable();
    if (!citus.ok()) {
      if (testing::CitusRequired()) {
        result.error = absl::StrCat(citus.message(), " (CI=true)");
      } else {
        result.skipped = std::string(citus.message());
      }
      return result;
    }
  }

  absl::StatusOr<std::unique_ptr<Cluster>> cluster =
      Cluster::Start(cluster_options);
  if (!cluster.ok()) {
    result.error =
        absl::StrCat("cluster did not start: ", cluster.status().message());
    return result;
  }
  Cluster& c = **cluster;
  Recorder recorder;
  Workload workload(workload_options, c.ClientAddresses(), c.DirectConnInfo(),
                    seed, &recorder);
  Nemesis nemesis(c, workload.shared(), seed + 1,
                  absl::Now() + config.duration);
  workload.Start();
  scenario->run(nemesis, config);
  workload.Stop();
  result.faults = nemesis.faults();
  result.fault_log = nemesis.log();
  result.error = nemesis.error();

  std::vector<Op> history = recorder.Take();
  for (Op& op : nemesis.extra_ops()) history.push_back(std::move(op));
  absl::Status healed = c.HealAll();
  absl::StatusOr<FinalState> final_state =
      healed.ok() ? c.Scan() : absl::StatusOr<FinalState>(healed);
  if (!final_state.ok()) {
    if (result.error.empty()) {
      result.error =
          absl::StrCat("final scan: ", final_state.status().message());
    }
  } else {
    result.report = Check(history, *final_state);
  }
  result.elapsed = absl::Now() - start;
  if (AbortRequested() && result.error.empty()) result.error = "aborted";

  if (!result.passed() && !config.artifacts_dir.empty()) {
    const std::string dir =
        absl::StrCat(config.artifacts_dir, "/", config.name, "-", config.seed);
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    std::ofstream h(dir + "/history.tsv");
    for (const Op& op : history) h << FormatOp(op) << "\n";
    std::ofstream readable(dir + "/history.txt");
    for (const Op& op : history) readable << DescribeOp(op) << "\n";
    std::ofstream f(dir + "/faults.txt");
    for (const std::string& line : result.fault_log) f << line << "\n";
    std::ofstream v(dir + "/violations.txt");
    for (const Violation& x : result.report.violations) {
      v << x.kind << " " << x.key << ": " << x.detail << "\n";
    }
    if (!result.error.empty()) v << "error: " << result.error << "\n";
    c.SaveLogs(dir);
  }
  return result;
}

std::string SummaryLine(const ScenarioResult& r) {
  if (!r.skipped.empty()) {
    return absl::StrCat("scenario ", r.name, " seed=", r.seed,
                        ": skipped: ", r.skipped, " SKIP");
  }
  const CheckStats& s = r.report.stats;
  std::string line = absl::StrCat(
      "scenario ", r.name, " seed=", r.seed, ": ops=", s.ops, " ok=", s.ok,
      " fail=", s.fail, " info=", s.info, " faults=", r.faults,
      " grants=", s.grants, " completes=", s.completes, " replays=", s.replays,
      " mismatches=", s.mismatches, " unknown_seen=", s.unknown_seen,
      " resolves=", s.resolves, " effects=", s.effects, " fenced=", s.fenced,
      " stale_rejected=", s.stale_rejected, " records=", s.records,
      " cache=", s.cache_valid, "/", s.cache_ignored,
      " violations=", r.report.violations.size(), " lost=", s.lost_acknowledged,
      " time=", absl::StrFormat("%.1f", absl::ToDoubleSeconds(r.elapsed)), "s ",
      r.passed() ? "PASS" : "FAIL");
  if (!r.error.empty()) absl::StrAppend(&line, " (", r.error, ")");
  return line;
}

}  // namespace idem::faults
