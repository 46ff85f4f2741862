#include "bench/histogram.h"

#include <algorithm>
#include <cmath>

namespace idem::bench {
namespace {

// Values below 2^kSubBits are exact; above, each power of two is split into
// 2^(kSubBits - 1) buckets.
constexpr int kSubBits = 7;
constexpr uint64_t kExact = uint64_t{1} << kSubBits;  // 128
constexpr uint64_t kHalf = kExact / 2;                // 64
constexpr int kBuckets = static_cast<int>(kExact + (64 - kSubBits) * kHalf);

int BitWidth(uint64_t v) { return 64 - __builtin_clzll(v); }

}  // namespace

Histogram::Histogram() : counts_(kBuckets, 0) {}

int Histogram::IndexOf(uint64_t value) {
  if (value < kExact) return static_cast<int>(value);
  // Keep the top kSubBits bits: value >> shift is in [64, 128).
  const int shift = BitWidth(value) - kSubBits;
  return static_cast<int>(kExact + (shift - 1) * kHalf +
                          ((value >> shift) - kHalf));
}

uint64_t Histogram::HighestInBucket(int index) {
  const auto i = static_cast<uint64_t>(index);
  if (i < kExact) return i;
  const int shift = static_cast<int>((i - kExact) / kHalf) + 1;
  const uint64_t top = (i - kExact) % kHalf + kHalf;
  return ((top + 1) << shift) - 1;
}

void Histogram::Record(int64_t value) {
  if (value < 0) value = 0;
  ++counts_[IndexOf(static_cast<uint64_t>(value))];
  if (count_ == 0 || value < min_) min_ = value;
  max_ = std::max(max_, value);
  ++count_;
  sum_ += static_cast<double>(value);
}

void Histogram::Merge(const Histogram& other) {
  if (other.count_ == 0) return;
  for (int i = 0; i < kBuckets; ++i) counts_[i] += other.counts_[i];
  min_ = count_ == 0 ? other.min_ : std::min(min_, other.min_);
  max_ = std::max(max_, other.max_);
  count_ += other.count_;
  sum_ += other.sum_;
}

double Histogram::Mean() const {
  return count_ == 0 ? 0 : sum_ / static_cast<double>(count_);
}

int64_t Histogram::Percentile(double percent) const {
  if (count_ == 0) return 0;
  percent = std::clamp(percent, 0.0, 100.0);
  const auto wanted = std::max<int64_t>(
      1, static_cast<int64_t>(
             std::ceil(percent / 100.0 * static_cast<double>(count_))));
  int64_t seen = 0;
  for (int i = 0; i < kBuckets; ++i) {
    seen += counts_[i];
    if (seen >= wanted) {
      return std::min<int64_t>(static_cast<int64_t>(HighestInBucket(i)), max_);
    }
  }
  return max_;
}

}  // namespace idem::bench
