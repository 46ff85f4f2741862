// One PostgreSQL connection per sidecar that LISTENs for record changes
// (NOTIFY from the trigger of sql/0003) and publishes them to a ChangeFeed.
// Reconnects with backoff; after a lost connection every waiter is woken,
// since events may have been missed.
#ifndef IDEM_SERVER_POSTGRES_PG_LISTENER_H_
#define IDEM_SERVER_POSTGRES_PG_LISTENER_H_

#include <string>
#include <thread>

#include "common/steady_wait.h"
#include "server/store/change_feed.h"

namespace idem {

// The NOTIFY channel; payload "tenant\noperation\nkey".
inline constexpr char kRecordChannel[] = "idempotency_record";

class PgListener {
 public:
  // Starts listening on its own thread. `feed` must outlive this.
  PgListener(const std::string& conninfo, ChangeFeed* feed);
  ~PgListener();
  PgListener(const PgListener&) = delete;
  PgListener& operator=(const PgListener&) = delete;

 private:
  void Loop();

  const std::string conninfo_;
  ChangeFeed* const feed_;
  SteadyNotification stop_;
  std::thread thread_;
};

}  // namespace idem

#endif  // IDEM_SERVER_POSTGRES_PG_LISTENER_H_
