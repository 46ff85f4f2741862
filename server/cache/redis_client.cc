#include "server/cache/redis_client.h"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <cerrno>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/steady_wait.h"
#include "common/thread_name.h"
#include "server/base/log.h"
#include "server/base/thread_names.h"
#include "server/cache/redis_breaker.h"

namespace idem {
namespace {

struct ContextFree {
  void operator()(redisContext* c) const { redisFree(c); }
};
using ContextPtr = std::unique_ptr<redisContext, ContextFree>;

struct ReplyFree {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using ReplyPtr = std::unique_ptr<redisReply, ReplyFree>;

// A command's arguments; what they view outlives the call that sends them.
using Command = absl::InlinedVector<absl::string_view, 5>;

// The status of a failed hiredis call on `c`; `saved_errno` is errno right
// after it. A read or write that ran into the socket timeout is
// DEADLINE_EXCEEDED, anything else UNAVAILABLE.
absl::Status ContextError(const redisContext* c, int saved_errno) {
  if (c->err == REDIS_ERR_IO &&
      (saved_errno == EAGAIN || saved_errno == EWOULDBLOCK ||
       saved_errno == ETIMEDOUT || saved_errno == EINPROGRESS)) {
    return absl::DeadlineExceededError(
        absl::StrCat("redis did not answer in time: ", c->errstr));
  }
  return absl::UnavailableError(absl::StrCat("redis: ", c->errstr));
}

// Whether `s` says something about Redis being reachable (a reason to open
// the breaker), rather than about one key or one reply.
bool ConnectivityFailure(const absl::Status& s) {
  return s.code() == absl::StatusCode::kDeadlineExceeded ||
         s.code() == absl::StatusCode::kUnavailable;
}

// Sends `commands` pipelined on `c` and reads one reply each. Fails only
// when the connection does (it must then be dropped); error replies are
// returned as replies.
absl::StatusOr<std::vector<ReplyPtr>> Exec(redisContext* c,
                                           const std::vector<Command>& cmds) {
  for (const Command& cmd : cmds) {
    absl::InlinedVector<const char*, 5> argv;
    absl::InlinedVector<size_t, 5> lens;
    for (absl::string_view arg : cmd) {
      argv.push_back(arg.data());
      lens.push_back(arg.size());
    }
    if (redisAppendCommandArgv(c, static_cast<int>(argv.size()), argv.data(),
                               lens.data()) != REDIS_OK) {
      return ContextError(c, errno);
    }
  }
  std::vector<ReplyPtr> replies;
  for (size_t i = 0; i < cmds.size(); ++i) {
    void* reply = nullptr;
    errno = 0;
    if (redisGetReply(c, &reply) != REDIS_OK || reply == nullptr) {
      return ContextError(c, errno);
    }
    replies.emplace_back(static_cast<redisReply*>(reply));
  }
  return replies;
}

absl::Status ErrorReply(const redisReply* r) {
  if (r->type == REDIS_REPLY_ERROR) {
    return absl::InternalError(
        absl::StrCat("redis: ", std::string(r->str, r->len)));
  }
  return absl::InternalError(
      absl::StrCat("redis: unexpected reply of type ", r->type));
}

class RedisClientImpl final : public RedisClient {
 public:
  RedisClientImpl(RedisOptions options, std::function<void(bool)> on_state)
      : options_(std::move(options)),
        on_state_(std::move(on_state)),
        breaker_(options_.backoff_min, options_.backoff_max),
        monitor_([this] { Monitor(); }) {}

  ~RedisClientImpl() override {
    {
      SteadyMutexLock lock(&mu_);
      stop_ = true;
      monitor_cv_.Signal();
    }
    monitor_.join();
  }

  absl::StatusOr<std::vector<std::optional<RedisValue>>> GetMany(
      const std::vector<std::string>& keys) override {
    std::vector<Command> cmds;
    cmds.reserve(2 * keys.size());
    for (const std::string& key : keys) {
      cmds.push_back({"GET", key});
      cmds.push_back({"PTTL", key});
    }
    absl::StatusOr<std::vector<ReplyPtr>> replies = Call(cmds);
    if (!replies.ok()) return replies.status();
    std::vector<std::optional<RedisValue>> out;
    out.reserve(keys.size());
    for (size_t i = 0; i < replies->size(); i += 2) {
      const redisReply* value = (*replies)[i].get();
      const redisReply* ttl = (*replies)[i + 1].get();
      if (value->type == REDIS_REPLY_NIL) {
        out.emplace_back(std::nullopt);
        continue;
      }
      if (value->type != REDIS_REPLY_STRING) return ErrorReply(value);
      if (ttl->type != REDIS_REPLY_INTEGER) return ErrorReply(ttl);
      std::optional<absl::Duration> left;
      if (ttl->integer != -1) {
        left = absl::Milliseconds(std::max<long long>(0, ttl->integer));
      }
      out.emplace_back(RedisValue{std::string(value->str, value->len), left});
    }
    return out;
  }

  absl::Status SetMany(const std::vector<RedisSet>& sets) override {
    if (sets.empty()) return absl::OkStatus();
    std::vector<std::string> ttls;  // reserved: the commands view them
    ttls.reserve(sets.size());
    std::vector<Command> cmds;
    cmds.reserve(sets.size());
    for (const RedisSet& set : sets) {
      ttls.push_back(absl::StrCat(
          std::max<int64_t>(1, absl::ToInt64Milliseconds(set.ttl))));
      cmds.push_back({"SET", set.key, set.value, "PX", ttls.back()});
    }
    absl::StatusOr<std::vector<ReplyPtr>> replies = Call(cmds);
    if (!replies.ok()) return replies.status();
    for (const ReplyPtr& r : *replies) {
      if (r->type != REDIS_REPLY_STATUS) return ErrorReply(r.get());
    }
    return absl::OkStatus();
  }

  absl::Status Del(const std::vector<std::string>& keys) override {
    if (keys.empty()) return absl::OkStatus();
    std::vector<Command> cmds;
    cmds.reserve(keys.size());
    for (const std::string& key : keys) cmds.push_back({"DEL", key});
    absl::StatusOr<std::vector<ReplyPtr>> replies = Call(cmds);
    if (!replies.ok()) return replies.status();
    for (const ReplyPtr& r : *replies) {
      if (r->type != REDIS_REPLY_INTEGER) return ErrorReply(r.get());
    }
    return absl::OkStatus();
  }

 private:
  // A pooled connection and the breaker epoch it was opened in.
  struct Conn {
    ContextPtr ctx;
    uint64_t epoch = 0;
    // Taken from the idle pool rather than opened for this call.
    bool reused = false;
  };

  // Connects, sets the timeout on the socket and authenticates.
  absl::StatusOr<ContextPtr> Connect() const {
    const timeval tv = absl::ToTimeval(options_.timeout);
    errno = 0;
    ContextPtr c(options_.address.unix_path.empty()
                     ? redisConnectWithTimeout(options_.address.host.c_str(),
                                               options_.address.port, tv)
                     : redisConnectUnixWithTimeout(
                           options_.address.unix_path.c_str(), tv));
    if (c == nullptr) return absl::UnavailableError("redis: out of memory");
    if (c->err != 0) return ContextError(c.get(), errno);
    if (redisSetTimeout(c.get(), tv) != REDIS_OK) {
      return ContextError(c.get(), errno);
    }
    if (!options_.password.empty()) {
      Command auth = {"AUTH", options_.password};
      if (!options_.user.empty()) {
        auth = {"AUTH", options_.user, options_.password};
      }
      absl::StatusOr<std::vector<ReplyPtr>> replies = Exec(c.get(), {auth});
      if (!replies.ok()) return replies.status();
      const redisReply* r = (*replies)[0].get();
      if (r->type != REDIS_REPLY_STATUS) {
        // The reply names the failure (e.g. WRONGPASS), never the password.
        return absl::UnavailableError(
            absl::StrCat("redis AUTH failed: ", ErrorReply(r).message()));
      }
    }
    return c;
  }

  // Runs `cmds` on a pooled connection.
  absl::StatusOr<std::vector<ReplyPtr>> Call(const std::vector<Command>& cmds) {
    for (int attempt = 0;; ++attempt) {
      absl::StatusOr<Conn> conn = Acquire();
      if (!conn.ok()) return conn.status();
      absl::StatusOr<std::vector<ReplyPtr>> replies =
          Exec(conn->ctx.get(), cmds);
      if (replies.ok()) {
        Release(*std::move(conn));
        return replies;
      }
      // A connection that sat idle may have been closed by Redis (its
      // `timeout` setting) or by a proxy in between, which says nothing
      // about Redis itself: retry once (every command here is idempotent)
      // before taking it as an outage. A timeout is never retried.
      const bool stale =
          conn->reused && attempt == 0 &&
          replies.status().code() == absl::StatusCode::kUnavailable;
      if (!stale) {
        Discard(conn->epoch, replies.status());
        return replies.status();
      }
      DiscardStale();
    }
  }

  // An idle pooled connection, or a new one while the pool has room.
  absl::StatusOr<Conn> Acquire() {
    const SteadyTime deadline = SteadyDeadline(options_.timeout);
    uint64_t epoch = 0;
    {
      SteadyMutexLock lock(&mu_);
      while (true) {
        if (!breaker_.closed()) {
          return absl::FailedPreconditionError("redis circuit breaker open");
        }
        if (!idle_.empty()) {
          Conn c = std::move(idle_.back());
          idle_.pop_back();
          c.reused = true;
          return c;
        }
        if (open_ < options_.pool_size) break;
        const bool changed = pool_cv_.WaitUntil(
            &lock, deadline, [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
              return !breaker_.closed() || !idle_.empty() ||
                     open_ < options_.pool_size;
            });
        if (!changed) {
          return absl::DeadlineExceededError(
              "no redis connection came free in time");
        }
      }
      ++open_;
      epoch = breaker_.epoch();
    }
    absl::StatusOr<ContextPtr> ctx = Connect();
    if (!ctx.ok()) {
      Discard(epoch, ctx.status());
      return ctx.status();
    }
    return Conn{*std::move(ctx), epoch};
  }

  // Returns a healthy connection to the pool, unless the breaker changed
  // state since it was opened.
  void Release(Conn conn) {
    SteadyMutexLock lock(&mu_);
    if (breaker_.closed() && conn.epoch == breaker_.epoch()) {
      idle_.push_back(std::move(conn));
    } else {
      --open_;
    }
    pool_cv_.Signal();
  }

  // Forgets a connection that failed (or was never opened) with `error`,
  // opening the breaker if the failure was about reachability.
  void Discard(uint64_t epoch, const absl::Status& error) {
    SteadyMutexLock lock(&mu_);
    --open_;
    pool_cv_.Signal();
    if (ConnectivityFailure(error) &&
        breaker_.CallFailed(epoch, SteadyClock::now())) {
      Down(error);
    }
  }

  // Forgets a pooled connection found closed, and the other idle ones with
  // it: they have likely been idle as long.
  void DiscardStale() {
    SteadyMutexLock lock(&mu_);
    open_ -= 1 + static_cast<int>(idle_.size());
    idle_.clear();
    pool_cv_.SignalAll();
  }

  // Redis became unusable: drops the idle connections (they may be stale),
  // wakes every waiter and the monitor, and reports the change.
  void Down(const absl::Status& error) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    open_ -= static_cast<int>(idle_.size());
    idle_.clear();
    pool_cv_.SignalAll();
    monitor_cv_.Signal();
    Report(false, error);
  }

  void Report(bool up, const absl::Status& error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    reported_ = true;
    if (up) {
      Log(LogLevel::kInfo, "redis reachable: cache in use",
          {{"redis", options_.address_text}});
    } else {
      Log(LogLevel::kWarn,
          "redis unreachable: lookups fall through to PostgreSQL",
          {{"redis", options_.address_text},
           {"error", std::string(error.message())},
           {"next_probe_in", absl::FormatDuration(breaker_.backoff())}});
    }
    if (on_state_) on_state_(up);
  }

  // Probes an open breaker after each backoff, and pings a closed one every
  // ping_interval so that an idle client notices an outage too.
  void Monitor() {
    NameThisThread(thread_names::kRedisMonitor);
    SteadyMutexLock lock(&mu_);
    SteadyTime last_ping = SteadyClock::now();
    while (!stop_) {
      const bool closed = breaker_.closed();
      const SteadyTime due =
          closed ? SteadyDeadline(options_.ping_interval, last_ping)
                 : breaker_.next_probe();
      if (SteadyClock::now() < due) {
        // Woken early when the breaker opens or the client stops.
        monitor_cv_.WaitUntil(
            &lock, due, [this, closed]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
              return stop_ || breaker_.closed() != closed;
            });
        continue;
      }
      if (closed) {
        lock.Unlock();
        Call({{"PING"}}).IgnoreError();  // A failure opens the breaker.
        lock.Lock();
        last_ping = SteadyClock::now();
        continue;
      }
      lock.Unlock();
      absl::Status probed;
      absl::StatusOr<ContextPtr> ctx = Connect();
      if (ctx.ok()) {
        absl::StatusOr<std::vector<ReplyPtr>> pong =
            Exec(ctx->get(), {{"PING"}});
        if (!pong.ok()) {
          probed = pong.status();
        } else if ((*pong)[0]->type != REDIS_REPLY_STATUS) {
          probed = ErrorReply((*pong)[0].get());
        }
      } else {
        probed = ctx.status();
      }
      lock.Lock();
      if (probed.ok()) {
        breaker_.ProbeSucceeded();
        idle_.push_back(Conn{*std::move(ctx), breaker_.epoch()});
        ++open_;
        last_ping = SteadyClock::now();
        Report(true, probed);
      } else {
        breaker_.ProbeFailed(SteadyClock::now());
        if (!reported_) Report(false, probed);
      }
    }
  }

  const RedisOptions options_;
  const std::function<void(bool)> on_state_;
  // On the steady clock: a wall-clock step neither cuts short a wait for a
  // pooled connection nor moves the monitor's pings and probes.
  SteadyMutex mu_;
  // Signalled when a connection comes free or the breaker opens.
  SteadyCondVar pool_cv_;
  // Signalled when the breaker opens or the client stops.
  SteadyCondVar monitor_cv_;
  CircuitBreaker breaker_ ABSL_GUARDED_BY(mu_);
  std::vector<Conn> idle_ ABSL_GUARDED_BY(mu_);
  // Connections idle, in use or being opened.
  int open_ ABSL_GUARDED_BY(mu_) = 0;
  // Whether any state was reported yet (the first failed probe is).
  bool reported_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread monitor_;
};

}  // namespace

absl::StatusOr<RedisAddress> ParseRedisAddress(const std::string& spec) {
  RedisAddress out;
  if (absl::StartsWith(spec, "unix:")) {
    out.unix_path = spec.substr(5);
    if (out.unix_path.empty() || out.unix_path[0] != '/') {
      return absl::InvalidArgumentError(absl::StrCat(
          "--redis=", spec, ": a Unix socket needs an absolute path"));
    }
    return out;
  }
  const size_t colon = spec.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--redis=", spec, ": expected HOST:PORT or unix:/path/to.sock"));
  }
  out.host = spec.substr(0, colon);
  if (out.host.front() == '[') {
    if (out.host.size() < 3 || out.host.back() != ']') {
      return absl::InvalidArgumentError(
          absl::StrCat("--redis=", spec, ": bad IPv6 address"));
    }
    out.host = out.host.substr(1, out.host.size() - 2);
  } else if (out.host.find(':') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--redis=", spec, ": write an IPv6 address in brackets, [::1]:6379"));
  }
  if (!absl::SimpleAtoi(spec.substr(colon + 1), &out.port) || out.port < 1 ||
      out.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--redis=", spec, ": bad port"));
  }
  return out;
}

std::unique_ptr<RedisClient> NewRedisClient(
    RedisOptions options, std::function<void(bool up)> on_state) {
  return std::make_unique<RedisClientImpl>(std::move(options),
                                           std::move(on_state));
}

}  // namespace idem
