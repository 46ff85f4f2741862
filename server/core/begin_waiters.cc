#include "server/core/begin_waiters.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace idem {
namespace {

// How often a key's parked Begins read again while the change feed is down.
constexpr absl::Duration kPollWhileFeedDown = absl::Milliseconds(250);
// After a failed read, how long until the next one.
constexpr absl::Duration kRetryRead = absl::Milliseconds(250);
// Past the holder's lease: expiry is due by the store's clock by then.
constexpr absl::Duration kAfterLease = absl::Milliseconds(5);

}  // namespace

BeginWaiters::BeginWaiters(Coordinator* coordinator, RecordStore* store,
                           ChangeFeed* feed, WaiterLimits limits,
                           CoreMetrics* metrics)
    : coordinator_(coordinator),
      store_(store),
      feed_(feed),
      limits_(limits),
      metrics_(metrics) {
  feed_->SetListener([this](const RecordKey* key, const Record* settled) {
    if (settled != nullptr) {
      OnSettled(*settled);
    } else {
      OnChange(key);
    }
  });
}

BeginWaiters::~BeginWaiters() {
  feed_->SetListener({});
  Shutdown();
  SteadyMutexLock lock(&mu_);
  while (submitted_ > 0) {
    idle_.WaitFor(&lock, absl::Seconds(1),
                  [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                    return submitted_ == 0;
                  });
  }
}

int64_t BeginWaiters::parked() {
  SteadyMutexLock lock(&mu_);
  return static_cast<int64_t>(parked_.size());
}

void BeginWaiters::Publish() {
  if (metrics_ != nullptr) {
    metrics_->SetWaiters(static_cast<int64_t>(parked_.size()));
  }
}

void BeginWaiters::Settle(std::shared_ptr<Ticket> ticket, const RecordKey& key,
                          const BeginCommand& cmd,
                          absl::StatusOr<BeginResult> result, SteadyTime until,
                          DoneFn done) {
  if (!result.ok() || result->outcome != Outcome::kInProgress ||
      SteadyClock::now() >= until) {
    done(result);
    return;
  }
  // Moved into parked_ if it parks; answered from here if not.
  auto p = std::make_unique<Parked>();
  p->ticket = std::move(ticket);
  p->key = key;
  p->cmd = cmd;
  p->last = *std::move(result);
  p->done = std::move(done);
  p->until = until;
  absl::Status refused;
  const char* bound = nullptr;
  bool parked = false;
  std::vector<RecordKey> to_read;
  {
    SteadyMutexLock lock(&mu_);
    auto group = groups_.find(key);
    if (shutdown_) {
      // Answered below as without a wait.
    } else if (p->ticket->cancelled()) {
      refused = absl::CancelledError("the caller cancelled the call");
    } else if (static_cast<int>(parked_.size()) >= limits_.total) {
      bound = "waiters";
      refused = absl::ResourceExhaustedError(absl::StrCat(
          "too many Begin calls waiting in this instance (--max-waiters=",
          limits_.total, ")"));
    } else if (auto t = per_tenant_.find(key.tenant);
               t != per_tenant_.end() && t->second >= limits_.per_tenant) {
      bound = "waiters_per_tenant";
      refused = absl::ResourceExhaustedError(absl::StrCat(
          "too many Begin calls of tenant ", key.tenant,
          " waiting (--max-waiters-per-tenant=", limits_.per_tenant, ")"));
    } else if (group != groups_.end() &&
               static_cast<int>(group->second.members.size()) >=
                   limits_.per_key) {
      bound = "waiters_per_key";
      refused = absl::ResourceExhaustedError(absl::StrCat(
          "too many Begin calls waiting on this key (--max-waiters-per-key=",
          limits_.per_key, ")"));
    } else {
      Ticket* const t = p->ticket.get();
      Group& g = groups_[key];
      g.members.insert(t);
      ++per_tenant_[key.tenant];
      const absl::Duration lease_left = p->last.lease_left;
      p->deadline = timers_.Schedule(until, [this, t] { OnDeadline(t); });
      parked_.emplace(t, std::move(*p));
      // The record may have settled between the read that found it
      // IN_PROGRESS and now, unseen by the feed: read once more. Begins
      // parking together share the reads.
      Refresh(key, g, &to_read);
      if (g.wake == 0) ScheduleWake(key, g, lease_left);
      Publish();
      parked = true;
    }
  }
  if (parked) {
    StartReads(to_read);
    return;
  }
  if (metrics_ != nullptr) {
    if (bound != nullptr) metrics_->Refused(bound);
    if (absl::IsCancelled(refused)) metrics_->WaiterDropped("cancelled");
  }
  if (!refused.ok()) {
    p->done(refused);
  } else {
    p->done(std::move(p->last));
  }
}

void BeginWaiters::Cancel(const std::shared_ptr<Ticket>& ticket) {
  ticket->cancelled_.store(true);
  Parked parked;
  {
    SteadyMutexLock lock(&mu_);
    if (parked_.find(ticket.get()) == parked_.end()) return;
    parked = Unpark(ticket.get());
    Publish();
  }
  if (metrics_ != nullptr) metrics_->WaiterDropped("cancelled");
  parked.done(absl::CancelledError("the caller cancelled the call"));
}

void BeginWaiters::Shutdown() {
  std::vector<Parked> all;
  {
    SteadyMutexLock lock(&mu_);
    shutdown_ = true;
    while (!parked_.empty()) all.push_back(Unpark(parked_.begin()->first));
    Publish();
  }
  for (Parked& p : all) {
    if (metrics_ != nullptr) metrics_->WaiterDropped("shutdown");
    p.done(std::move(p.last));
  }
}

BeginWaiters::Parked BeginWaiters::Unpark(Ticket* ticket) {
  auto it = parked_.find(ticket);
  Parked p = std::move(it->second);
  parked_.erase(it);
  timers_.Cancel(p.deadline);
  auto tenant = per_tenant_.find(p.key.tenant);
  if (--tenant->second == 0) per_tenant_.erase(tenant);
  auto group = groups_.find(p.key);
  group->second.members.erase(ticket);
  // A group with a read in flight goes when the read is done.
  if (group->second.members.empty() && !group->second.reading) {
    timers_.Cancel(group->second.wake);
    groups_.erase(group);
  }
  return p;
}

void BeginWaiters::OnChange(const RecordKey* key) {
  std::vector<RecordKey> to_read;
  {
    SteadyMutexLock lock(&mu_);
    if (key != nullptr) {
      auto it = groups_.find(*key);
      if (it == groups_.end()) return;
      Refresh(it->first, it->second, &to_read);
    } else {
      for (auto& [k, group] : groups_) Refresh(k, group, &to_read);
    }
  }
  StartReads(to_read);
}

void BeginWaiters::Refresh(const RecordKey& key, Group& group,
                           std::vector<RecordKey>* to_read) {
  if (group.reading) {
    group.read_again = true;
    return;
  }
  group.reading = true;
  to_read->push_back(key);
}

void BeginWaiters::StartReads(const std::vector<RecordKey>& keys) {
  for (const RecordKey& key : keys) {
    Started();
    // Every read marks the record: a Begin stays parked only on a read
    // after which the record's settle is published.
    store_->ReadForWaiter(key,
                          [this, key](const absl::StatusOr<StoreRead>& read) {
                            OnRead(key, read);
                            Finished();
                          });
  }
}

void BeginWaiters::Started() {
  SteadyMutexLock lock(&mu_);
  ++submitted_;
}

void BeginWaiters::Finished() {
  SteadyMutexLock lock(&mu_);
  if (--submitted_ == 0) idle_.SignalAll();
}

void BeginWaiters::OnRead(const RecordKey& key,
                          const absl::StatusOr<StoreRead>& read) {
  Woken woken;
  std::vector<RecordKey> to_read;
  {
    SteadyMutexLock lock(&mu_);
    auto it = groups_.find(key);
    if (it == groups_.end()) return;
    Group& group = it->second;
    group.reading = false;
    const bool again = group.read_again;
    group.read_again = false;
    if (group.members.empty()) {
      timers_.Cancel(group.wake);
      groups_.erase(it);
      return;
    }
    if (!read.ok()) {
      // Keep waiting: the wait's end answers them if the store stays away.
      timers_.Cancel(group.wake);
      ScheduleWake(key, group, kRetryRead);
      return;
    }
    if (again) Refresh(key, group, &to_read);
    woken = Decide(it, *read);
  }
  Deliver(woken);
  StartReads(to_read);
}

void BeginWaiters::OnSettled(const Record& settled) {
  Woken woken;
  {
    SteadyMutexLock lock(&mu_);
    auto it = groups_.find(settled.key);
    if (it == groups_.end()) return;
    // A read in flight may answer an older state: the Begins it finds
    // still parked decide on it, and the settle reaches them again (the
    // store publishes it).
    woken = Decide(it, StoreRead{settled, settled.updated_at});
  }
  Deliver(woken);
}

BeginWaiters::Woken BeginWaiters::Decide(
    std::map<RecordKey, Group>::iterator it, const StoreRead& read) {
  const RecordKey& key = it->first;
  Group& group = it->second;
  std::vector<Leaving> leaving;
  leaving.reserve(group.members.size());
  std::optional<absl::Duration> lease_left;
  // A crowd on one key mostly sent one command (a retry storm): it is
  // decided once, and the Begins that leave share the answer.
  const BeginCommand* decided_for = nullptr;
  std::optional<BeginResult> still;  // the decision, if IN_PROGRESS
  std::shared_ptr<const absl::StatusOr<BeginResult>> answer;
  for (Ticket* t : group.members) {
    Parked& p = parked_[t];
    if (decided_for == nullptr || !(p.cmd == *decided_for)) {
      decided_for = &p.cmd;
      std::optional<absl::StatusOr<BeginResult>> decided =
          coordinator_->DecideWoken(key, p.cmd, read);
      still.reset();
      answer.reset();
      if (decided && decided->ok() &&
          (*decided)->outcome == Outcome::kInProgress) {
        still = **std::move(decided);
      } else if (decided) {
        answer = std::make_shared<const absl::StatusOr<BeginResult>>(
            *std::move(decided));
      }
    }
    if (still) {
      lease_left = still->lease_left;
      p.last = *still;
      continue;
    }
    leaving.push_back(Leaving{t, answer});
  }
  if (lease_left) {
    timers_.Cancel(group.wake);
    ScheduleWake(key, group, *lease_left);
  }
  // Unpark may drop the group: nothing of it is used past here.
  Woken woken;
  woken.answers.reserve(leaving.size());
  for (Leaving& l : leaving) {
    Parked p = Unpark(l.ticket);
    if (l.decided) {
      woken.answers.push_back(Answer{std::move(p.done), std::move(l.decided)});
    } else {
      woken.reruns.push_back(std::move(p));
    }
  }
  if (!leaving.empty()) Publish();
  return woken;
}

void BeginWaiters::Deliver(Woken& woken) {
  for (Answer& a : woken.answers) a.done(*a.result);
  for (Parked& p : woken.reruns) Rerun(std::move(p));
}

void BeginWaiters::Rerun(Parked parked) {
  auto p = std::make_shared<Parked>(std::move(parked));
  Started();
  coordinator_->Begin(p->key, p->cmd,
                      [this, p](absl::StatusOr<BeginResult> result) {
                        Settle(std::move(p->ticket), p->key, p->cmd,
                               std::move(result), p->until, std::move(p->done));
                        Finished();
                      });
}

void BeginWaiters::OnDeadline(Ticket* ticket) {
  Parked parked;
  {
    SteadyMutexLock lock(&mu_);
    if (parked_.find(ticket) == parked_.end()) return;
    parked = Unpark(ticket);
    Publish();
  }
  if (metrics_ != nullptr) metrics_->WaiterDropped("deadline");
  parked.done(std::move(parked.last));
}

void BeginWaiters::ScheduleWake(const RecordKey& key, Group& group,
                                absl::Duration lease_left) {
  absl::Duration after =
      std::max(lease_left, absl::ZeroDuration()) + kAfterLease;
  if (!feed_->live()) after = std::min(after, kPollWhileFeedDown);
  group.wake = timers_.Schedule(SteadyDeadline(after), [this, key] {
    std::vector<RecordKey> to_read;
    {
      SteadyMutexLock lock(&mu_);
      auto it = groups_.find(key);
      if (it == groups_.end()) return;
      it->second.wake = 0;
      Refresh(key, it->second, &to_read);
    }
    StartReads(to_read);
  });
}

}  // namespace idem
