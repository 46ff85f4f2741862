// A small synchronous Redis client for the cache: a pool of hiredis
// connections, a short timeout on every connect and command, and a circuit
// breaker, so that a dead or stopped Redis costs at most one timeout per
// backoff window instead of one per call.
#ifndef IDEM_SERVER_CACHE_REDIS_CLIENT_H_
#define IDEM_SERVER_CACHE_REDIS_CLIENT_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace idem {

// Where Redis listens: TCP (host, port) or a Unix socket (unix_path).
struct RedisAddress {
  std::string host;
  int port = 0;
  std::string unix_path;
};

// Parses "HOST:PORT", "[IPV6]:PORT" or "unix:/path/to.sock";
// INVALID_ARGUMENT otherwise.
absl::StatusOr<RedisAddress> ParseRedisAddress(const std::string& spec);

// A value and how long Redis keeps it: nullopt when it has no TTL (PTTL
// -1), zero when the key expired between the GET and the PTTL.
struct RedisValue {
  std::string value;
  std::optional<absl::Duration> ttl;
};

// One SET of SetMany: `value` under `key` for `ttl` (whole milliseconds, at
// least 1).
struct RedisSet {
  std::string key;
  std::string value;
  absl::Duration ttl;
};

struct RedisOptions {
  RedisAddress address;
  // As given by the operator; only for logs.
  std::string address_text;
  // AUTH: with `password` empty, none; with `user` empty too, the legacy
  // single-argument form.
  std::string user;
  std::string password;
  // Bounds connecting, each command, and waiting for a pooled connection.
  absl::Duration timeout = absl::Milliseconds(5);
  int pool_size = 32;
  // Wait before the first probe of a Redis that failed; doubled after each
  // failed probe up to backoff_max.
  absl::Duration backoff_min = absl::Milliseconds(100);
  absl::Duration backoff_max = absl::Seconds(1);
  // While Redis is up, how often an idle client checks that it still is.
  absl::Duration ping_interval = absl::Seconds(1);
};

// Thread-safe. Errors of every call:
//   FAILED_PRECONDITION  the breaker is open: Redis failed recently and has
//                        not answered a probe since; nothing was sent.
//   DEADLINE_EXCEEDED    no answer within the timeout, or no pooled
//                        connection came free within it.
//   UNAVAILABLE          connecting, authenticating or the connection failed.
//   INTERNAL             Redis answered with an error or an unexpected reply.
// A timeout or a connection failure opens the breaker; a background thread
// then probes (connect, AUTH, PING) after each backoff and closes it again.
class RedisClient {
 public:
  virtual ~RedisClient() = default;

  // GET and PTTL of each of `keys`, pipelined in one round trip (one command
  // each: keys may live in different Redis Cluster slots). One result per
  // key, in order: nullopt when Redis has no such key.
  virtual absl::StatusOr<std::vector<std::optional<RedisValue>>> GetMany(
      const std::vector<std::string>& keys) = 0;

  // SET key value PX ttl of each of `sets`, pipelined in one round trip
  // (one command each, as GetMany). Fails if any of them did.
  virtual absl::Status SetMany(const std::vector<RedisSet>& sets) = 0;

  // DEL of each of `keys`, pipelined one key per command (keys of different
  // records may live in different Redis Cluster slots).
  virtual absl::Status Del(const std::vector<std::string>& keys) = 0;
};

// Returns a client that connects lazily and probes Redis at once in the
// background. `on_state` (may be empty) is told true each time Redis becomes
// usable and false each time it stops being so (also when the first probe
// fails); it runs under the client's lock and must not call the client. Each
// change is also logged once, without the password. The process must ignore
// SIGPIPE (hiredis writes to sockets the peer may have closed).
std::unique_ptr<RedisClient> NewRedisClient(
    RedisOptions options, std::function<void(bool up)> on_state);

}  // namespace idem

#endif  // IDEM_SERVER_CACHE_REDIS_CLIENT_H_
