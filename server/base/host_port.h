// Listen addresses as the flags take them: "host:port" or "[v6]:port".
#ifndef IDEM_SERVER_BASE_HOST_PORT_H_
#define IDEM_SERVER_BASE_HOST_PORT_H_

#include <string>

#include "absl/strings/string_view.h"

namespace idem {

// Splits `hostport` into its host (brackets of an IPv6 literal removed) and
// port (0-65535). Returns false, leaving both unspecified, when malformed.
bool SplitHostPort(absl::string_view hostport, std::string* host, int* port);

}  // namespace idem

#endif  // IDEM_SERVER_BASE_HOST_PORT_H_
