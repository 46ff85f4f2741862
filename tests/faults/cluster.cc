#include "tests/faults/cluster.h"

#include <grpcpp/grpcpp.h>
#include <hiredis/hiredis.h>

#include <fstream>
#include <pqxx/pqxx>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "tests/testing/files.h"
#include "tests/testing/ports.h"
#include "tests/testing/process.h"

namespace idem::faults {
namespace {

constexpr char kConfig[] = R"(defaults:
  lease: 3s
  min_lease: 1s
  max_lease: 1h
  retention: 24h
  on_lease_expiry: unknown
operations:
  create-payment: {on_lease_expiry: unknown}
  send-email: {on_lease_expiry: release}
)";

// The sidecars' --redis-mac-key-file; the checker verifies cached values
// with it.
constexpr char kMacKey[] = "faults-suite-redis-mac-key-0123456789";

constexpr char kSchema[] = R"(
CREATE TABLE faults_fence (
  key       text   PRIMARY KEY,
  max_token bigint NOT NULL);
CREATE TABLE faults_effect (
  key    text        NOT NULL,
  token  bigint      NOT NULL,
  writer text        NOT NULL,
  at     timestamptz NOT NULL DEFAULT clock_timestamp(),
  PRIMARY KEY (key, token, writer));
)";

pb::Status ParseStatusName(const std::string& name) {
  pb::Status s = pb::STATUS_UNSPECIFIED;
  pb::Status_Parse("STATUS_" + name, &s);
  return s;
}

}  // namespace

bool WaitServing(const std::string& address, absl::Duration timeout) {
  auto channel =
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto stub = grpc::health::v1::Health::NewStub(channel);
  const absl::Time end = absl::Now() + timeout;
  while (true) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
    grpc::health::v1::HealthCheckRequest req;
    grpc::health::v1::HealthCheckResponse resp;
    if (stub->Check(&ctx, req, &resp).ok() &&
        resp.status() == grpc::health::v1::HealthCheckResponse::SERVING) {
      return true;
    }
    if (absl::Now() >= end) return false;
    absl::SleepFor(absl::Milliseconds(100));
  }
}

absl::StatusOr<std::unique_ptr<Cluster>> Cluster::Start(
    const ClusterOptions& options) {
  std::unique_ptr<Cluster> c(new Cluster());
  c->options_ = options;
  c->offsets_ = options.clock_offsets;
  c->offsets_.resize(options.sidecars);
  absl::StatusOr<std::string> dir = testing::MakeTempDir("idem-faults-");
  if (!dir.ok()) return dir.status();
  c->dir_ = *dir;
  c->config_path_ = c->dir_ + "/policies.yaml";
  {
    std::ofstream f(c->config_path_);
    f << kConfig;
    if (!f) return absl::InternalError("cannot write " + c->config_path_);
  }
  c->mac_key_path_ = c->dir_ + "/redis-mac-key";
  {
    std::ofstream f(c->mac_key_path_);
    f << kMacKey;
    if (!f) return absl::InternalError("cannot write " + c->mac_key_path_);
  }
  for (const std::string& offset : c->offsets_) {
    if (offset.empty()) continue;
    if (!testing::RunCommand({"faketime", "-f", "+0s", "true"}).ok()) {
      return absl::FailedPreconditionError(
          "faketime is not installed (Debian: apt-get install faketime)");
    }
    break;
  }
  if (options.patroni) {
    // Short timings (testing::PatroniCluster::Options; the figures they
    // give are in docs/operations.md#under-patroni).
    absl::StatusOr<std::unique_ptr<testing::PatroniCluster>> patroni =
        testing::PatroniCluster::Start(testing::PatroniCluster::Options());
    if (!patroni.ok()) return patroni.status();
    c->patroni_ = *std::move(patroni);
  } else if (options.citus) {
    absl::StatusOr<std::unique_ptr<testing::CitusCluster>> citus =
        testing::CitusCluster::Start();
    if (!citus.ok()) return citus.status();
    c->citus_ = *std::move(citus);
    // Eight shards per table (Citus' default: 32) for --migrate to
    // distribute: the rebalance then moves one or two shard groups, not nine
    // (each takes seconds on a loaded 2-core machine).
    for (const char* sql : {"ALTER SYSTEM SET citus.shard_count = 8",
                            "SELECT pg_reload_conf()"}) {
      absl::StatusOr<std::string> done = c->citus_->coordinator().Psql(sql);
      if (!done.ok()) return done.status();
    }
  } else {
    absl::StatusOr<std::unique_ptr<testing::PgCluster>> pg =
        testing::PgCluster::Start();
    if (!pg.ok()) return pg.status();
    c->pg_ = *std::move(pg);
  }
  absl::StatusOr<std::unique_ptr<testing::RedisServer>> redis =
      testing::RedisServer::Start();
  if (!redis.ok()) return redis.status();
  c->redis_ = *std::move(redis);
  absl::StatusOr<std::string> schema = c->Psql(kSchema);
  if (!schema.ok()) return schema.status();
  absl::StatusOr<std::string> migrated = testing::RunCommand(
      {options.sidecar_path, "migrate", "--postgres=" + c->DirectConnInfo()});
  if (!migrated.ok()) return migrated.status();
  // A failover pair runs without PgBouncer even in the PgBouncer run:
  // pointing a bouncer at the new primary is its operator's job, and the
  // sidecars find the primary themselves through their two-host conninfo.
  if (options.standby) {
    absl::Status s = c->StartStandby();
    if (!s.ok()) return s;
  } else if (testing::UsePgBouncer() && !options.patroni && !options.citus) {
    absl::StatusOr<std::unique_ptr<testing::PgBouncer>> bouncer =
        testing::PgBouncer::Start(*c->pg_);
    if (!bouncer.ok()) return bouncer.status();
    c->bouncer_ = *std::move(bouncer);
  }

  for (int i = 0; i < options.sidecars; ++i) {
    absl::StatusOr<std::unique_ptr<FaultProxy>> p;
    // A proxy forwards to one port; under Patroni the primary moves between
    // three.
    if (c->patroni_ == nullptr) {
      p = FaultProxy::Start(c->bouncer_ != nullptr ? c->bouncer_->port()
                                                   : c->Primary().port());
      if (!p.ok()) return p.status();
      c->pg_proxies_.push_back(*std::move(p));
    }
    p = FaultProxy::Start(c->redis_->port());
    if (!p.ok()) return p.status();
    c->redis_proxies_.push_back(*std::move(p));
    const int port = testing::FreePort();
    c->ports_.push_back(port);
    absl::StatusOr<std::unique_ptr<testing::SidecarProcess>> s =
        c->SpawnSidecar(i, port);
    if (!s.ok()) return s.status();
    c->sidecars_.push_back(*std::move(s));
    p = FaultProxy::Start(port);
    if (!p.ok()) return p.status();
    c->client_proxies_.push_back(*std::move(p));
  }
  for (int i = 0; i < options.sidecars; ++i) {
    if (!WaitServing(c->sidecars_[i]->Address(), absl::Seconds(30))) {
      std::string log = c->sidecars_[i]->Log();
      if (log.size() > 4000) log = log.substr(log.size() - 4000);
      return absl::UnavailableError(
          absl::StrCat("sidecar ", i, " not SERVING\n", log));
    }
  }
  return c;
}

absl::Status Cluster::StartStandby() {
  absl::StatusOr<std::unique_ptr<testing::PgCluster>> standby =
      testing::PgCluster::StartStandby(*pg_);
  if (!standby.ok()) return standby.status();
  standby_ = *std::move(standby);
  // Set on the primary only: the standby, once promoted, has no standby of
  // its own to wait for (as a failover manager such as Patroni sets it).
  for (const char* sql : {"ALTER SYSTEM SET synchronous_standby_names = '*'",
                          "SELECT pg_reload_conf()"}) {
    absl::StatusOr<std::string> done = pg_->Psql(sql);
    if (!done.ok()) return done.status();
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (true) {
    absl::StatusOr<std::string> state = pg_->Psql(
        "SELECT string_agg(sync_state, ',') FROM pg_stat_replication");
    if (state.ok() && *state == "sync") return absl::OkStatus();
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "the standby is not a synchronous standby within 30 s (",
          state.ok() ? *state : std::string(state.status().message()), ")"));
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
}

absl::Status Cluster::FailOver(absl::Duration detection) {
  absl::Status s = pg_->Kill();
  if (!s.ok()) return s;
  failed_over = true;
  absl::SleepFor(detection);
  return standby_->Promote();
}

Cluster::~Cluster() {
  // Sidecars first (they hold connections through the proxies), then the
  // proxies, then Redis and PostgreSQL.
  sidecars_.clear();
  client_proxies_.clear();
  pg_proxies_.clear();
  redis_proxies_.clear();
  if (pg_paused) Primary().Resume().IgnoreError();
  redis_.reset();
  bouncer_.reset();
  standby_.reset();
  pg_.reset();
  patroni_.reset();
  citus_.reset();
  if (!dir_.empty()) testing::RemoveTempDir(dir_);
}

absl::StatusOr<std::string> Cluster::Psql(const std::string& sql) const {
  if (patroni_ == nullptr) return Primary().Psql(sql);
  absl::StatusOr<int> leader = patroni_->Leader();
  if (!leader.ok()) return leader.status();
  return patroni_->Psql(*leader, sql);
}

std::string Cluster::DirectConnInfo() const {
  if (patroni_ != nullptr) return patroni_->ConnInfo();
  if (standby_ == nullptr) return Primary().ConnInfo();
  return absl::StrCat("host=127.0.0.1,127.0.0.1 port=", pg_->port(), ",",
                      standby_->port(),
                      " user=postgres dbname=postgres"
                      " target_session_attrs=read-write");
}

std::vector<std::string> Cluster::ClientAddresses() const {
  std::vector<std::string> out;
  for (const auto& p : client_proxies_) {
    out.push_back(absl::StrCat("127.0.0.1:", p->port()));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<testing::SidecarProcess>> Cluster::SpawnSidecar(
    int i, int port) {
  // Alone, through the proxy. With a standby, the primary through the proxy
  // and the standby direct: libpq takes the first that accepts writes.
  // Under Patroni, the three nodes direct.
  std::string postgres;
  if (patroni_ != nullptr) {
    postgres = patroni_->ConnInfo();
  } else if (standby_ != nullptr) {
    postgres =
        absl::StrCat("host=127.0.0.1,127.0.0.1 port=", pg_proxies_[i]->port(),
                     ",", standby_->port(),
                     " user=postgres dbname=postgres"
                     " target_session_attrs=read-write");
  } else {
    postgres = absl::StrCat("host=127.0.0.1 port=", pg_proxies_[i]->port(),
                            " user=postgres dbname=postgres");
  }
  std::vector<std::string> args = {
      "--postgres=" + postgres,
      absl::StrCat("--redis=127.0.0.1:", redis_proxies_[i]->port()),
      "--redis-mac-key-file=" + mac_key_path_,
      "--config=" + config_path_,
      "--pg-statement-timeout=2s",
      "--pg-pool-size=8",
      "--reaper-interval=250ms",
      "--redis-timeout=25ms",
      "--grace-period=1s",
      "--log-level=warn",
  };
  if (bouncer_ != nullptr) {
    args.push_back("--postgres-direct=" + DirectConnInfo());
    args.emplace_back("--pg-prepared=off");
  }
  args.insert(args.end(), options_.extra_args.begin(),
              options_.extra_args.end());
  std::string binary = options_.sidecar_path;
  std::vector<std::string> env;
  if (!offsets_[i].empty()) {
    // faketime sets LD_PRELOAD=libfaketime and FAKETIME itself. Only the
    // wall clock is skewed, as on a host whose clock is wrong.
    args.insert(args.begin(), {"-f", offsets_[i], options_.sidecar_path});
    binary = "faketime";
    env.emplace_back("FAKETIME_DONT_FAKE_MONOTONIC=1");
  }
  return testing::SidecarProcess::Start(binary, args, port, env,
                                        absl::Seconds(30));
}

absl::Status Cluster::RestartSidecar(int i) {
  if (sidecars_[i]->Running()) return absl::OkStatus();
  return sidecars_[i]->StartAgain();
}

absl::Status Cluster::RestartSidecarWithClock(int i,
                                              const std::string& offset) {
  sidecars_[i]->Kill().IgnoreError();
  sidecars_[i].reset();
  offsets_[i] = offset;
  absl::StatusOr<std::unique_ptr<testing::SidecarProcess>> s =
      SpawnSidecar(i, ports_[i]);
  if (!s.ok()) return s.status();
  sidecars_[i] = *std::move(s);
  return absl::OkStatus();
}

absl::Status Cluster::HealAll(absl::Duration timeout) {
  for (auto* proxies : {&client_proxies_, &pg_proxies_, &redis_proxies_}) {
    for (auto& p : *proxies) p->Pass();
  }
  if (pg_paused) {
    absl::Status s = Primary().Resume();
    if (!s.ok()) return s;
    pg_paused = false;
  }
  if (pg_stopped) {
    absl::Status s = Primary().StartAgain();
    if (!s.ok()) return s;
    pg_stopped = false;
  }
  if (redis_paused) {
    absl::Status s = redis_->Resume();
    if (!s.ok()) return s;
    redis_paused = false;
  }
  if (redis_killed) {
    absl::Status s = redis_->StartAgain();
    if (!s.ok()) return s;
    redis_killed = false;
  }
  for (int i = 0; i < size(); ++i) {
    if (!sidecars_[i]->Running()) {
      absl::Status s = sidecars_[i]->StartAgain();
      if (!s.ok()) return s;
    }
  }
  for (int i = 0; i < size(); ++i) {
    if (!WaitServing(sidecars_[i]->Address(), timeout)) {
      return absl::UnavailableError(
          absl::StrCat("sidecar ", i, " not SERVING after healing"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<FinalState> Cluster::Scan() {
  FinalState state;
  state.tenant = kTenant;
  state.cache_mac_key = kMacKey;
  state.max_cache_ttl_ms = kRetentionMs;
  try {
    pqxx::connection conn(DirectConnInfo() + " connect_timeout=10");
    pqxx::work tx(conn);
    pqxx::result rows = tx.exec_params(
        "SELECT operation, idempotency_key, status, fencing_token, attempt,"
        " encode(request_hash, 'hex'), result_code IS NOT NULL,"
        " coalesce(result_code, 0),"
        " encode(coalesce(result_body, ''::bytea), 'hex'),"
        " coalesce(result_content_type, ''), retryable, resolved_by"
        " FROM idempotency_record WHERE tenant_id = $1",
        std::string(kTenant));
    for (const auto& row : rows) {
      FinalRecord r;
      r.key = absl::StrCat(row[0].c_str(), "/", row[1].c_str());
      r.status = ParseStatusName(row[2].c_str());
      r.token = row[3].as<int64_t>();
      r.attempt = row[4].as<int32_t>();
      r.request_hash = absl::HexStringToBytes(row[5].c_str());
      r.has_result = row[6].as<bool>();
      if (r.has_result) {
        r.result.set_code(row[7].as<int32_t>());
        r.result.set_body(absl::HexStringToBytes(row[8].c_str()));
        r.result.set_content_type(row[9].c_str());
      }
      r.retryable = row[10].as<bool>();
      r.resolved_by = row[11].c_str();
      state.records[r.key] = std::move(r);
    }
    rows = tx.exec_params(
        "SELECT operation, idempotency_key, h.key, h.value"
        " FROM idempotency_record r, jsonb_each_text(r.result_headers) h"
        " WHERE tenant_id = $1 AND result_headers IS NOT NULL",
        std::string(kTenant));
    for (const auto& row : rows) {
      auto it =
          state.records.find(absl::StrCat(row[0].c_str(), "/", row[1].c_str()));
      if (it == state.records.end()) continue;
      (*it->second.result.mutable_headers())[row[2].c_str()] = row[3].c_str();
    }
    rows = tx.exec_params(
        "SELECT operation, idempotency_key, from_status, to_status, actor,"
        " fencing_token FROM idempotency_audit WHERE tenant_id = $1"
        " ORDER BY id",
        std::string(kTenant));
    for (const auto& row : rows) {
      AuditRow a;
      a.key = absl::StrCat(row[0].c_str(), "/", row[1].c_str());
      a.from = ParseStatusName(row[2].c_str());
      a.to = ParseStatusName(row[3].c_str());
      a.actor = row[4].c_str();
      a.token = row[5].as<int64_t>();
      state.audit.push_back(std::move(a));
    }
    rows = tx.exec("SELECT key, token FROM faults_effect ORDER BY at");
    for (const auto& row : rows) {
      state.effects[row[0].c_str()].push_back(row[1].as<int64_t>());
    }
    tx.commit();
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("final scan of PostgreSQL: ", e.what()));
  }

  timeval tv{5, 0};
  redisContext* r = redisConnectWithTimeout("127.0.0.1", redis_->port(), tv);
  if (r == nullptr || r->err) {
    std::string error = r ? r->errstr : "out of memory";
    if (r) redisFree(r);
    return absl::UnavailableError("final scan of Redis: " + error);
  }
  redisSetTimeout(r, tv);
  std::string cursor = "0";
  absl::Status status;
  do {
    auto* reply = static_cast<redisReply*>(
        redisCommand(r, "SCAN %s MATCH idem:* COUNT 1000", cursor.c_str()));
    if (reply == nullptr || reply->type != REDIS_REPLY_ARRAY ||
        reply->elements != 2) {
      if (reply) freeReplyObject(reply);
      status = absl::UnavailableError("final scan of Redis: SCAN failed");
      break;
    }
    cursor = std::string(reply->element[0]->str, reply->element[0]->len);
    redisReply* keys = reply->element[1];
    for (size_t i = 0; i < keys->elements; ++i) {
      CacheEntry e;
      e.redis_key = std::string(keys->element[i]->str, keys->element[i]->len);
      auto* v = static_cast<redisReply*>(
          redisCommand(r, "GET %b", e.redis_key.data(), e.redis_key.size()));
      if (v != nullptr && v->type == REDIS_REPLY_STRING) {
        e.value = std::string(v->str, v->len);
      }
      if (v) freeReplyObject(v);
      v = static_cast<redisReply*>(
          redisCommand(r, "PTTL %b", e.redis_key.data(), e.redis_key.size()));
      if (v != nullptr && v->type == REDIS_REPLY_INTEGER)
        e.pttl_ms = v->integer;
      if (v) freeReplyObject(v);
      state.cache.push_back(std::move(e));
    }
    freeReplyObject(reply);
  } while (cursor != "0");
  redisFree(r);
  if (!status.ok()) return status;
  return state;
}

void Cluster::SaveLogs(const std::string& dir) {
  for (int i = 0; i < size(); ++i) {
    std::ofstream(absl::StrCat(dir, "/sidecar-", i, ".log"))
        << sidecars_[i]->Log();
  }
  if (pg_ != nullptr) std::ofstream(dir + "/postgresql.log") << pg_->Log();
  if (patroni_ != nullptr) {
    for (int i = 0; i < patroni_->size(); ++i) {
      std::ofstream(absl::StrCat(dir, "/patroni-node", i, ".log"))
          << patroni_->NodeLog(i);
    }
    std::ofstream(dir + "/etcd.log") << patroni_->EtcdLog();
  }
  if (standby_ != nullptr) {
    std::ofstream(dir + "/postgresql-standby.log") << standby_->Log();
  }
  if (citus_ != nullptr) {
    std::ofstream(dir + "/citus-coordinator.log")
        << citus_->coordinator().Log();
    for (int i = 0; i < citus_->workers(); ++i) {
      std::ofstream(absl::StrCat(dir, "/citus-worker", i, ".log"))
          << citus_->worker(i).Log();
    }
  }
  std::ofstream(dir + "/redis.log") << redis_->Log();
}

}  // namespace idem::faults
