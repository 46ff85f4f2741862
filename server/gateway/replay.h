// The bytes of a replayed answer, written straight from the record: the
// same status line, fields and body Boost.Beast wrote for it, without a
// response object, its field nodes or its serializer on the replay path.
#ifndef IDEM_SERVER_GATEWAY_REPLAY_H_
#define IDEM_SERVER_GATEWAY_REPLAY_H_

#include <string>

#include "statemachine/record.h"

namespace idem::gateway {

// Appends to `out` the answer replaying `record` (COMPLETED or FAILED) to a
// request of HTTP `version` (10, 11) that asked for keep-alive or not:
// the recorded status (200 or 500 by the record's status when it is no
// HTTP status), the recorded fields but hop-by-hop ones, Content-Type,
// `Idempotent-Replayed: true`, Connection as keep-alive needs, and
// Content-Length with the body (0 and none for 204 and 304). False, with `out`
// untouched, when a recorded field name is not lower-case (a record made
// outside the gateway): then the caller builds the answer field by field.
bool AppendReplay(const Record& record, unsigned version, bool keep_alive,
                  std::string* out);

}  // namespace idem::gateway

#endif  // IDEM_SERVER_GATEWAY_REPLAY_H_
