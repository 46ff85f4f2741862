#include "server/coordinator.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/log.h"

namespace idem {
namespace {

// Each lost race means another caller changed the record in between; a
// handful of rounds is plenty unless something is badly wrong.
constexpr int kMaxRounds = 16;

}  // namespace

absl::StatusOr<Coordinator::Done> Coordinator::Run(
    const RecordKey& key, const DecideFn& decide,
    const std::optional<Write>& try_first, std::optional<Record> held) {
  // The first round may decide on the record try_first's insert ran into,
  // or on the held one.
  std::optional<StoreRead> found;
  if (held) found = StoreRead{std::move(held), absl::Now()};
  if (try_first) {
    absl::StatusOr<InsertOrReadResult> first = store_->InsertOrRead(*try_first);
    if (!first.ok()) return first.status();
    if (first->created) {
      return Done{Outcome::kAcquired, *std::move(first->created), absl::Now()};
    }
    found = std::move(first->existing);
  }
  for (int round = 0; round < kMaxRounds; ++round) {
    // The first round's record, if one came with the call; then reads.
    absl::StatusOr<StoreRead> read =
        found ? absl::StatusOr<StoreRead>(*std::exchange(found, std::nullopt))
              : store_->Read(key);
    if (!read.ok()) return read.status();
    Decision d = decide(read->record, read->now);
    if (std::optional<absl::StatusOr<Done>> settled = Settled(d, *read)) {
      return *std::move(settled);
    }
    if (!d.write->guard) {
      absl::Status capacity = CheckCapacity(key.tenant);
      if (!capacity.ok()) return capacity;
    }
    absl::StatusOr<std::optional<Record>> written = store_->Apply(*d.write);
    if (!written.ok()) return written.status();
    if (written->has_value()) {
      if (d.write->audit) Audited(*d.write, **written);
      return Done{d.outcome, std::move(**written), read->now};
    }
  }
  return absl::AbortedError(absl::StrCat("record changed concurrently ",
                                         kMaxRounds, " times in a row; retry"));
}

absl::StatusOr<Coordinator::Done> Coordinator::RunHolder(const RecordKey& key,
                                                         int64_t token,
                                                         const DecideFn& decide,
                                                         bool keep) {
  absl::StatusOr<Done> done =
      Run(key, decide, std::nullopt, held_.Find(key, token));
  if (done.ok() && keep) {
    held_.Put(done->record);
  } else if (done.ok() || absl::IsFailedPrecondition(done.status()) ||
             absl::IsNotFound(done.status())) {
    held_.Erase(key);
  }
  return done;
}

bool Coordinator::RunHolderAsync(const RecordKey& key, int64_t token,
                                 const DecideFn& decide, bool keep,
                                 HolderFn done) {
  std::optional<Record> held = held_.Find(key, token);
  if (!held) return false;
  Decision d = decide(held, absl::Now());
  // Errors and audited writes (with their logs and counts) are Run's.
  if (!d.error.ok() || !d.write || d.write->audit) return false;
  return store_->ApplyAsync(*d.write,
                            [this, key, keep, done = std::move(done)](
                                absl::StatusOr<std::optional<Record>> written) {
                              if (!written.ok()) return done(written.status());
                              if (!written->has_value()) {
                                // Stale: the blocking form reads instead.
                                held_.Erase(key);
                                return done(std::nullopt);
                              }
                              if (keep) {
                                held_.Put(**written);
                              } else {
                                held_.Erase(key);
                              }
                              done(**std::move(written));
                            });
}

bool Coordinator::HeartbeatAsync(const RecordKey& key,
                                 const HeartbeatCommand& cmd, HolderFn done) {
  return RunHolderAsync(
      key, cmd.fencing_token,
      [&cmd](const std::optional<Record>& cur, absl::Time) {
        return DecideHeartbeat(cur, cmd);
      },
      /*keep=*/true, std::move(done));
}

bool Coordinator::CompleteAsync(const RecordKey& key,
                                const CompleteCommand& cmd, HolderFn done) {
  const Policy& policy = policies_->For(key.operation);
  return RunHolderAsync(
      key, cmd.fencing_token,
      [&cmd, &policy](const std::optional<Record>& cur, absl::Time) {
        return DecideComplete(cur, cmd, policy);
      },
      /*keep=*/false, std::move(done));
}

bool Coordinator::FailAsync(const RecordKey& key, const FailCommand& cmd,
                            HolderFn done) {
  const Policy& policy = policies_->For(key.operation);
  return RunHolderAsync(
      key, cmd.fencing_token,
      [&cmd, &policy](const std::optional<Record>& cur, absl::Time) {
        return DecideFail(cur, cmd, policy);
      },
      /*keep=*/false, std::move(done));
}

std::optional<absl::StatusOr<Coordinator::Done>> Coordinator::Settled(
    const Decision& d, StoreRead& read) {
  if (d.stale_token && metrics_ != nullptr) metrics_->FencingRejected();
  if (!d.error.ok()) return d.error;
  if (d.write) return std::nullopt;
  if (!read.record) return absl::NotFoundError("record not found");
  return Done{d.outcome, std::move(*read.record), read.now};
}

std::optional<Coordinator::Done> Coordinator::FromCache(
    std::optional<CachedRecord> cached, const DecideFn& decide) {
  if (!cached) return std::nullopt;
  const absl::Time now = absl::Now();
  // Moved, not copied, into the optional `decide` takes.
  std::optional<Record> record(std::move(cached->record));
  Decision d = decide(record, now);
  if (!d.error.ok() || d.write) return std::nullopt;
  return Done{d.outcome, *std::move(record), now, cached->source};
}

absl::Status Coordinator::CheckCapacity(const std::string& tenant) {
  if (options_.max_processing_per_tenant <= 0) return absl::OkStatus();
  absl::StatusOr<int64_t> open = store_->CountProcessing(tenant);
  if (!open.ok()) return open.status();
  if (*open >= options_.max_processing_per_tenant) {
    return absl::ResourceExhaustedError(
        absl::StrCat("tenant ", tenant, " has ", *open,
                     " PROCESSING records open; the cap is ",
                     options_.max_processing_per_tenant));
  }
  return absl::OkStatus();
}

void Coordinator::Audited(const Write& write, const Record& written) {
  const AuditEntry& a = *write.audit;
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
  const Decision d = BeginDecider(key, cmd, policies_->For(key.operation))(
      mine.record, mine.now);
  std::optional<absl::StatusOr<Done>> settled = Settled(d, mine);
  if (!settled) return std::nullopt;
  if (!settled->ok()) return settled->status();
  return ToBeginResult(**std::move(settled));
}

Coordinator::DecideFn Coordinator::BeginDecider(const RecordKey& key,
                                                const BeginCommand& cmd,
                                                const Policy& policy) {
  return
      [&key, &cmd, &policy](const std::optional<Record>& cur, absl::Time now) {
        return DecideBegin(cur, key, cmd, now, policy);
      };
}

BeginResult Coordinator::ToBeginResult(Done done) {
  if (done.outcome == Outcome::kAcquired) held_.Put(done.record);
  BeginResult result;
  result.outcome = done.outcome;
  result.record = std::move(done.record);
  result.cached = done.cache_source != nullptr;
  result.cache_source = done.cache_source;
  if (result.outcome == Outcome::kInProgress) {
    result.retry_after = RetryAfter(result.record, done.now);
    result.lease_left = result.record.lease_expires_at - done.now;
  }
  return result;
}

std::vector<std::optional<BeginResult>> Coordinator::BeginFromCacheMany(
    const std::vector<const RecordKey*>& keys,
    const std::vector<const BeginCommand*>& cmds) {
  std::vector<std::optional<CachedRecord>> cached =
      store_->ReadCachedMany(keys);
  std::vector<std::optional<BeginResult>> out(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    std::optional<Done> d = FromCache(
        std::move(cached[i]),
        BeginDecider(*keys[i], *cmds[i], policies_->For(keys[i]->operation)));
    if (d) out[i] = ToBeginResult(*std::move(d));
  }
  return out;
}

bool Coordinator::BeginFromStoreAsync(const RecordKey& key,
                                      const BeginCommand& cmd,
                                      BeginFromStoreFn done) {
  // A cap means counting first (Begin does that).
  if (options_.max_processing_per_tenant > 0) return false;
  const Policy& policy = policies_->For(key.operation);
  std::optional<Write> insert =
      DecideBegin(std::nullopt, key, cmd, absl::Now(), policy).write;
  if (!insert) return false;
  return store_->InsertOrReadAsync(
      *insert, [this, key, cmd, &policy,
                done = std::move(done)](absl::StatusOr<InsertOrReadResult> r) {
        if (!r.ok()) return done(r.status());
        if (r->created) {
          return done(ToBeginResult(
              Done{Outcome::kAcquired, *std::move(r->created), absl::Now()}));
        }
        // A record the statement could not see: read again, in Begin.
        if (!r->existing) return done(std::nullopt);
        const Decision d = BeginDecider(key, cmd, policy)(r->existing->record,
                                                          r->existing->now);
        std::optional<absl::StatusOr<Done>> settled = Settled(d, *r->existing);
        // A write to make (a lease to expire, a retryable failure to take
        // over): Begin runs the read-decide-write rounds.
        if (!settled) return done(std::nullopt);
        if (!settled->ok()) return done(settled->status());
        done(ToBeginResult(**std::move(settled)));
      });
}

absl::StatusOr<BeginResult> Coordinator::Begin(const RecordKey& key,
                                               const BeginCommand& cmd,
                                               bool cache_checked) {
  const Policy& policy = policies_->For(key.operation);
  const DecideFn decide = BeginDecider(key, cmd, policy);
  absl::StatusOr<Done> done;
  std::optional<Done> cached;
  if (!cache_checked) cached = FromCache(store_->ReadCached(key), decide);
  if (cached) {
    done = *std::move(cached);
  } else {
    // Most Begins that reach the store are for new keys: try the insert
    // before reading, unless a cap means counting first (then a replay
    // should not pay for the count).
    std::optional<Write> first;
    if (options_.max_processing_per_tenant <= 0) {
      first = DecideBegin(std::nullopt, key, cmd, absl::Now(), policy).write;
    }
    done = Run(key, decide, first);
  }
  if (!done.ok()) return done.status();
  return ToBeginResult(*std::move(done));
}

absl::StatusOr<Record> Coordinator::Heartbeat(const RecordKey& key,
                                              const HeartbeatCommand& cmd) {
  absl::StatusOr<Done> done = RunHolder(
      key, cmd.fencing_token,
      [&](const std::optional<Record>& cur, absl::Time) {
        return DecideHeartbeat(cur, cmd);
      },
      /*keep=*/true);
  if (!done.ok()) return done.status();
  return std::move(done->record);
}

absl::StatusOr<Record> Coordinator::Complete(const RecordKey& key,
                                             const CompleteCommand& cmd) {
  const Policy& policy = policies_->For(key.operation);
  absl::StatusOr<Done> done = RunHolder(
      key, cmd.fencing_token,
      [&](const std::optional<Record>& cur, absl::Time) {
        return DecideComplete(cur, cmd, policy);
      },
      /*keep=*/false);
  if (!done.ok()) return done.status();
  return std::move(done->record);
}

absl::StatusOr<Record> Coordinator::Fail(const RecordKey& key,
                                         const FailCommand& cmd) {
  const Policy& policy = policies_->For(key.operation);
  absl::StatusOr<Done> done = RunHolder(
      key, cmd.fencing_token,
      [&](const std::optional<Record>& cur, absl::Time) {
        return DecideFail(cur, cmd, policy);
      },
      /*keep=*/false);
  if (!done.ok()) return done.status();
  return std::move(done->record);
}

absl::StatusOr<Record> Coordinator::Get(const RecordKey& key) {
  const Policy& policy = policies_->For(key.operation);
  const DecideFn decide = [&](const std::optional<Record>& cur,
                              absl::Time now) {
    return DecideGet(cur, now, policy);
  };
  if (std::optional<Done> cached = FromCache(store_->ReadCached(key), decide)) {
    return std::move(cached->record);
  }
  absl::StatusOr<Done> done = Run(key, decide, std::nullopt);
  if (!done.ok()) return done.status();
  return std::move(done->record);
}

absl::StatusOr<Record> Coordinator::Resolve(const RecordKey& key,
                                            const ResolveCommand& cmd) {
  const Policy& policy = policies_->For(key.operation);
  absl::StatusOr<Done> done = Run(
      key,
      [&](const std::optional<Record>& cur, absl::Time) {
        return DecideResolve(cur, cmd, policy);
      },
      std::nullopt);
  if (!done.ok()) return done.status();
  return std::move(done->record);
}

}  // namespace idem
