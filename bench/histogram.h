// A latency histogram with logarithmic buckets (the HdrHistogram layout):
// values below 128 are exact, larger ones fall in 64 buckets per power of
// two, so any reported value is within 1/64 (1.6%) of a recorded one. Memory
// is fixed (about 16 KiB) whatever the number of samples.
#ifndef IDEM_BENCH_HISTOGRAM_H_
#define IDEM_BENCH_HISTOGRAM_H_

#include <cstdint>
#include <vector>

namespace idem::bench {

// Not thread-safe: keep one per thread and Merge them at the end.
class Histogram {
 public:
  Histogram();

  // Records one value (negative values count as 0).
  void Record(int64_t value);
  // Adds every value recorded in `other`.
  void Merge(const Histogram& other);

  int64_t count() const { return count_; }
  int64_t max() const { return max_; }
  int64_t min() const { return count_ == 0 ? 0 : min_; }
  // The mean of the recorded values; 0 when empty.
  double Mean() const;
  // The smallest value v such that at least `percent`% of the recorded values
  // are <= v (within the bucket precision, never above max()); 0 when empty.
  int64_t Percentile(double percent) const;

 private:
  static int IndexOf(uint64_t value);
  // The largest value that falls in bucket `index`.
  static uint64_t HighestInBucket(int index);

  std::vector<int64_t> counts_;
  int64_t count_ = 0;
  int64_t max_ = 0;
  int64_t min_ = 0;
  double sum_ = 0;
};

}  // namespace idem::bench

#endif  // IDEM_BENCH_HISTOGRAM_H_
