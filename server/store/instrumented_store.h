// A Store decorator that times every operation into
// idem_store_duration_seconds{store,op} and counts failures in
// idem_store_errors_total{store,kind}.
#ifndef IDEM_SERVER_STORE_INSTRUMENTED_STORE_H_
#define IDEM_SERVER_STORE_INSTRUMENTED_STORE_H_

#include <memory>
#include <string>

#include "server/store/store.h"
#include "server/store/store_metrics.h"

namespace idem {

// Wraps `base`, labelling its metrics with `name` ("postgres", "memory").
// `metrics` must outlive the result.
std::unique_ptr<Store> NewInstrumentedStore(std::unique_ptr<Store> base,
                                            std::string name,
                                            StoreMetrics* metrics);

}  // namespace idem

#endif  // IDEM_SERVER_STORE_INSTRUMENTED_STORE_H_
