#include "server/core/coordinator.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/base/log.h"

namespace idem {
namespace {

// Each lost race means another caller changed the record in between; a
// handful of rounds is plenty unless something is badly wrong.
constexpr int kMaxRounds = 16;

}  // namespace

void Coordinator::ReadStep(std::shared_ptr<Op> op) {
  // A copy of the key: `op` moves into the completion.
  const RecordKey key = op->key;
  store_->Read(key, [this, op = std::move(op)](absl::StatusOr<StoreRead> read) {
    Step(op, std::move(read));
  });
}

void Coordinator::Step(std::shared_ptr<Op> op, absl::StatusOr<StoreRead> read) {
  if (!read.ok()) return op->done(read.status());
  if (++op->rounds > kMaxRounds) {
    return op->done(absl::AbortedError(absl::StrCat(
        "record changed concurrently ", kMaxRounds, " times in a row; retry")));
  }
  Decision d = op->decide(read->record, read->now);
  if (std::optional<absl::StatusOr<Done>> settled = Settled(d, *read)) {
    return op->done(*std::move(settled));
  }
  const absl::Time now = read->now;
  if (d.write->guard || options_.max_processing_per_tenant <= 0) {
    return WriteStep(std::move(op), *d.write, d.outcome, now);
  }
  // A new record: the tenant's cap is counted first.
  const std::string tenant = op->key.tenant;
  store_->CountProcessing(
      tenant, [this, op = std::move(op), write = *std::move(d.write),
               outcome = d.outcome, now](absl::StatusOr<int64_t> open) mutable {
        if (!open.ok()) return op->done(open.status());
        if (*open >= options_.max_processing_per_tenant) {
          return op->done(absl::ResourceExhaustedError(
              absl::StrCat("tenant ", op->key.tenant, " has ", *open,
                           " PROCESSING records open; the cap is ",
                           options_.max_processing_per_tenant)));
        }
        WriteStep(std::move(op), write, outcome, now);
      });
}

void Coordinator::WriteStep(std::shared_ptr<Op> op, const Write& write,
                            Outcome outcome, absl::Time now) {
  // What the completion needs of the write: its audit entry.
  std::optional<AuditEntry> audit = write.audit;
  store_->Apply(write,
                [this, op = std::move(op), audit = std::move(audit), outcome,
                 now](absl::StatusOr<std::optional<Record>> written) {
                  if (!written.ok()) return op->done(written.status());
                  // The guard no longer held: read and decide again.
                  if (!written->has_value()) return ReadStep(op);
                  if (audit) Audited(*audit, **written);
                  op->done(Done{outcome, **std::move(written), now});
                });
}

void Coordinator::RunHolder(const RecordKey& key, int64_t token,
                            DecideFn decide, bool keep, RecordFn done) {
  auto op = std::make_shared<Op>();
  op->key = key;
  op->decide = std::move(decide);
  op->done = [this, key, keep,
              done = std::move(done)](absl::StatusOr<Done> result) {
    if (result.ok() && keep) {
      held_.Put(result->record);
    } else if (result.ok() || absl::IsFailedPrecondition(result.status()) ||
               absl::IsNotFound(result.status())) {
      held_.Erase(key);
    }
    if (!result.ok()) return done(result.status());
    done(std::move(result->record));
  };
  // A held record may be stale: its write's guard then fails, and the next
  // round reads.
  if (std::optional<Record> held = held_.Find(key, token)) {
    return Step(std::move(op), StoreRead{std::move(held), absl::Now()});
  }
  ReadStep(std::move(op));
}

void Coordinator::RunRead(const RecordKey& key, DecideFn decide,
                          RecordFn done) {
  auto op = std::make_shared<Op>();
  op->key = key;
  op->decide = std::move(decide);
  op->done = [done = std::move(done)](absl::StatusOr<Done> result) {
    if (!result.ok()) return done(result.status());
    done(std::move(result->record));
  };
  ReadStep(std::move(op));
}

std::optional<absl::StatusOr<Coordinator::Done>> Coordinator::Settled(
    const Decision& d, StoreRead& read) {
  if (d.stale_token && metrics_ != nullptr) metrics_->FencingRejected();
  if (!d.error.ok()) return d.error;
  if (d.write) return std::nullopt;
  if (!read.record) return absl::NotFoundError("record not found");
  return Done{d.outcome, std::move(*read.record), read.now};
}

std::optional<BeginResult> Coordinator::BeginFromCache(
    const RecordKey& key, const BeginCommand& cmd,
    std::optional<CachedRecord> cached) {
  if (!cached) return std::nullopt;
  const absl::Time now = absl::Now();
  const Decision d = DecideBegin(cached->record.get(), key, cmd, now,
                                 policies_->For(key.operation));
  if (!d.error.ok() || d.write) return std::nullopt;
  return ToBeginResult(d.outcome, std::move(cached->record), now,
                       cached->source);
}

void Coordinator::Audited(const AuditEntry& a, const Record& written) {
  Log(LogLevel::kInfo, "audited transition",
      {{"tenant", written.key.tenant},
       {"operation", written.key.operation},
       {"key", written.key.key},
       {"from", StatusName(a.from)},
       {"to", StatusName(a.to)},
       {"status", StatusName(written.status)},
       {"actor", a.actor},
       {"fencing_token", absl::StrCat(a.fencing_token)}});
  if (metrics_ == nullptr) return;
  if (a.actor == kActorLazyExpiry) {
    metrics_->LeaseExpired(
        written.key.operation,
        policies_->For(written.key.operation).on_lease_expiry);
  } else if (a.actor == kActorLateReport) {
    metrics_->Resolved(kActorLateReport);
  }
}

std::optional<absl::StatusOr<BeginResult>> Coordinator::DecideWoken(
    const RecordKey& key, const BeginCommand& cmd, const StoreRead& read) {
  // A copy: the other Begins woken by the same change decide on it too.
  StoreRead mine = read;
  const Decision d = DecideBegin(mine.record, key, cmd, mine.now,
                                 policies_->For(key.operation));
  std::optional<absl::StatusOr<Done>> settled = Settled(d, mine);
  if (!settled) return std::nullopt;
  if (!settled->ok()) return settled->status();
  return ToBeginResult(**std::move(settled));
}

Coordinator::DecideFn Coordinator::BeginDecider(const RecordKey& key,
                                                BeginCommand cmd) const {
  const Policy& policy = policies_->For(key.operation);
  return [key, cmd = std::move(cmd), &policy](const std::optional<Record>& cur,
                                              absl::Time now) {
    return DecideBegin(cur, key, cmd, now, policy);
  };
}

BeginResult Coordinator::ToBeginResult(Outcome outcome,
                                       std::shared_ptr<const Record> record,
                                       absl::Time now,
                                       const char* cache_source) {
  if (outcome == Outcome::kAcquired) held_.Put(*record);
  BeginResult result;
  result.outcome = outcome;
  result.cached = cache_source != nullptr;
  result.cache_source = cache_source;
  if (outcome == Outcome::kInProgress) {
    result.retry_after = RetryAfter(*record, now);
    result.lease_left = record->lease_expires_at - now;
  }
  result.record = std::move(record);
  return result;
}

BeginResult Coordinator::ToBeginResult(Done done) {
  return ToBeginResult(done.outcome,
                       std::make_shared<const Record>(std::move(done.record)),
                       done.now, /*cache_source=*/nullptr);
}

std::vector<std::optional<BeginResult>> Coordinator::BeginFromCacheMany(
    const std::vector<const RecordKey*>& keys,
    const std::vector<const BeginCommand*>& cmds) {
  std::vector<std::optional<CachedRecord>> cached =
      store_->ReadCachedMany(keys);
  std::vector<std::optional<BeginResult>> out(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    out[i] = BeginFromCache(*keys[i], *cmds[i], std::move(cached[i]));
  }
  return out;
}

void Coordinator::Begin(const RecordKey& key, BeginCommand cmd, BeginFn done,
                        bool cache_checked) {
  if (!cache_checked) {
    if (std::optional<BeginResult> cached =
            BeginFromCache(key, cmd, store_->ReadCached(key))) {
      return done(*std::move(cached));
    }
  }
  auto op = std::make_shared<Op>();
  op->key = key;
  op->decide = BeginDecider(key, std::move(cmd));
  // Most Begins that reach the store are for new keys: try the insert
  // before reading, unless a cap means counting first (then a replay
  // should not pay for the count).
  std::optional<Write> insert;
  if (options_.max_processing_per_tenant <= 0) {
    insert = op->decide(std::nullopt, absl::Now()).write;
  }
  op->done = [this, done = std::move(done)](absl::StatusOr<Done> result) {
    if (!result.ok()) return done(result.status());
    done(ToBeginResult(*std::move(result)));
  };
  if (!insert) return ReadStep(std::move(op));
  store_->InsertOrRead(*insert, [this, op = std::move(op)](
                                    absl::StatusOr<InsertOrReadResult> r) {
    if (!r.ok()) return op->done(r.status());
    if (r->created) {
      return op->done(
          Done{Outcome::kAcquired, *std::move(r->created), absl::Now()});
    }
    // A record the statement could not see (committed after it began):
    // read it.
    if (!r->existing) return ReadStep(op);
    Step(op, *std::move(r->existing));
  });
}

void Coordinator::Heartbeat(const RecordKey& key, HeartbeatCommand cmd,
                            RecordFn done) {
  RunHolder(
      key, cmd.fencing_token,
      [cmd](const std::optional<Record>& cur, absl::Time) {
        return DecideHeartbeat(cur, cmd);
      },
      /*keep=*/true, std::move(done));
}

void Coordinator::Complete(const RecordKey& key, CompleteCommand cmd,
                           RecordFn done) {
  const Policy& policy = policies_->For(key.operation);
  const int64_t token = cmd.fencing_token;
  RunHolder(
      key, token,
      [cmd = std::move(cmd), &policy](const std::optional<Record>& cur,
                                      absl::Time) {
        return DecideComplete(cur, cmd, policy);
      },
      /*keep=*/false, std::move(done));
}

void Coordinator::Fail(const RecordKey& key, FailCommand cmd, RecordFn done) {
  const Policy& policy = policies_->For(key.operation);
  const int64_t token = cmd.fencing_token;
  RunHolder(
      key, token,
      [cmd = std::move(cmd), &policy](const std::optional<Record>& cur,
                                      absl::Time) {
        return DecideFail(cur, cmd, policy);
      },
      /*keep=*/false, std::move(done));
}

void Coordinator::Get(const RecordKey& key, RecordFn done) {
  const Policy& policy = policies_->For(key.operation);
  // Cached records are terminal: the local clock serves as "now".
  if (std::optional<CachedRecord> cached = store_->ReadCached(key)) {
    const Decision d = DecideGet(cached->record.get(), absl::Now(), policy);
    if (d.error.ok() && !d.write) return done(Record(*cached->record));
  }
  RunRead(
      key,
      [&policy](const std::optional<Record>& cur, absl::Time now) {
        return DecideGet(cur, now, policy);
      },
      std::move(done));
}

void Coordinator::Resolve(const RecordKey& key, ResolveCommand cmd,
                          RecordFn done) {
  const Policy& policy = policies_->For(key.operation);
  RunRead(
      key,
      [cmd = std::move(cmd), &policy](const std::optional<Record>& cur,
                                      absl::Time) {
        return DecideResolve(cur, cmd, policy);
      },
      std::move(done));
}

}  // namespace idem
