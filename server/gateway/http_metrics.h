// What the HTTP gateway reports, besides the core's figures.
#ifndef IDEM_SERVER_GATEWAY_HTTP_METRICS_H_
#define IDEM_SERVER_GATEWAY_HTTP_METRICS_H_

#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/core/core_metrics.h"

namespace idem {

class HttpMetrics : public virtual CoreMetrics {
 public:
  // One request the gateway answered: idem_http_requests_total{route,
  // result} and idem_http_request_seconds{result}. `route` is a configured
  // route's name or "-"; `result` one of docs/gateway.md#metrics.
  virtual void HttpRequest(absl::string_view route, const char* result,
                           absl::Duration d) = 0;
  // The series HttpRequest(route, result, d) updates, found once: the
  // gateway keeps one per route and result. Thread-safe.
  class RequestSeries {
   public:
    virtual ~RequestSeries() = default;
    virtual void Add(absl::Duration d) = 0;
  };
  // Owned by the metrics; the same one for the same labels.
  virtual RequestSeries* HttpRequestSeries(absl::string_view route,
                                           const char* result) = 0;
  // A counter of the core's that the gateway bumps per request.
  class Counter {
   public:
    virtual ~Counter() = default;
    virtual void Increment() = 0;
  };
  // The counters BeginOutcome(operation, outcome) and Replay(source) bump,
  // found once: the gateway keeps one per route and outcome, and per
  // source. Owned by the metrics; the same one for the same labels.
  // Thread-safe.
  virtual Counter* BeginOutcomeCounter(const std::string& operation,
                                       Outcome outcome) = 0;
  virtual Counter* ReplayCounter(const std::string& source) = 0;
  // `kind`: "not_sent", "timeout", "broken".
  virtual void HttpUpstreamError(const char* kind) = 0;
};

}  // namespace idem

#endif  // IDEM_SERVER_GATEWAY_HTTP_METRICS_H_
