// Renders what idem-bench measured: a table for people, JSON for files and a
// one-line "RESULT key=value ..." summary that scripts parse with plain shell.
#ifndef IDEM_BENCH_REPORT_H_
#define IDEM_BENCH_REPORT_H_

#include <string>

#include "bench/load.h"

namespace idem::bench {

// `label` names the run (the scenario name as given on the command line).
std::string FormatTable(const std::string& label, const LoadOptions& options,
                        const LoadResult& result);

// One JSON document; throughput_rps and errors_total are top-level fields.
std::string FormatJson(const std::string& label, const LoadOptions& options,
                       const LoadResult& result);

// "RESULT scenario=... throughput=... p50_us=... ... errors=N".
std::string FormatSummaryLine(const std::string& label,
                              const LoadOptions& options,
                              const LoadResult& result);

}  // namespace idem::bench

#endif  // IDEM_BENCH_REPORT_H_
