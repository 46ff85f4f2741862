#ifndef IDEM_TESTS_TESTING_PORTS_H_
#define IDEM_TESTS_TESTING_PORTS_H_

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace idem::testing {

// Returns a random TCP port on 127.0.0.1, below the kernel's ephemeral
// range (so no outgoing connection takes it meanwhile), that a listener
// could bind a moment ago. Aborts the test binary if it finds none.
int FreePort();

// Returns true iff a TCP connection to 127.0.0.1:port succeeds right now.
bool PortAcceptsConnections(int port);

// Returns OK once a TCP connection to 127.0.0.1:port succeeds, or
// DEADLINE_EXCEEDED after `timeout`.
absl::Status WaitForPort(int port, absl::Duration timeout);

}  // namespace idem::testing

#endif  // IDEM_TESTS_TESTING_PORTS_H_
