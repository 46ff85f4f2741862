#include "server/base/host_port.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"

namespace idem {

bool SplitHostPort(absl::string_view hostport, std::string* host, int* port) {
  const size_t colon = hostport.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) return false;
  absl::string_view h = hostport.substr(0, colon);
  if (absl::StartsWith(h, "[") && absl::EndsWith(h, "]")) {
    h = h.substr(1, h.size() - 2);
  }
  if (h.empty() || !absl::SimpleAtoi(hostport.substr(colon + 1), port) ||
      *port < 0 || *port > 65535) {
    return false;
  }
  *host = std::string(h);
  return true;
}

}  // namespace idem
