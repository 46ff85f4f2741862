// The bytes of a replayed answer, written straight from the record: the
// same status line, fields and body Boost.Beast wrote for it, without a
// response object, its field nodes or its serializer on the replay path.
#ifndef IDEM_SERVER_GATEWAY_REPLAY_H_
#define IDEM_SERVER_GATEWAY_REPLAY_H_

#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>
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

// The HTTP status replaying `record`: the recorded one, or 200 or 500 by the
// record's status when it recorded none.
unsigned ReplayStatus(const Record& record);

// The same answer as a Beast response, field by field, before keep-alive
// and framing: for records AppendReplay refuses.
boost::beast::http::response<boost::beast::http::string_body> ReplayResponse(
    const Record& record, unsigned version);

}  // namespace idem::gateway

#endif  // IDEM_SERVER_GATEWAY_REPLAY_H_
