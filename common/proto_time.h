// Conversions between Abseil's time types and protobuf's well-known
// Timestamp and Duration, shared by the server's wire layer and the client.
#ifndef IDEM_COMMON_PROTO_TIME_H_
#define IDEM_COMMON_PROTO_TIME_H_

#include <cstdint>

#include "absl/time/time.h"
#include "google/protobuf/duration.pb.h"
#include "google/protobuf/timestamp.pb.h"

namespace idem {

// To whole microseconds (PostgreSQL's resolution), rounded down, with nanos
// in [0, 999999000] as Timestamp requires. Writes in place: a message's own
// field is filled without a temporary to copy and destroy.
inline void ToProto(absl::Time t, google::protobuf::Timestamp* out) {
  const int64_t micros = absl::ToUnixMicros(t);
  int64_t seconds = micros / 1000000;
  int64_t rest = micros % 1000000;
  if (rest < 0) {
    rest += 1000000;
    --seconds;
  }
  out->set_seconds(seconds);
  out->set_nanos(static_cast<int32_t>(rest * 1000));
}

inline google::protobuf::Timestamp ToProto(absl::Time t) {
  google::protobuf::Timestamp ts;
  ToProto(t, &ts);
  return ts;
}

inline absl::Time FromProto(const google::protobuf::Timestamp& t) {
  return absl::FromUnixSeconds(t.seconds()) + absl::Nanoseconds(t.nanos());
}

// Seconds and nanos of the same sign, as Duration requires.
inline google::protobuf::Duration DurationToProto(absl::Duration d) {
  google::protobuf::Duration out;
  const int64_t nanos = absl::ToInt64Nanoseconds(d);
  out.set_seconds(nanos / 1000000000);
  out.set_nanos(static_cast<int32_t>(nanos % 1000000000));
  return out;
}

inline absl::Duration FromProto(const google::protobuf::Duration& d) {
  return absl::Seconds(d.seconds()) + absl::Nanoseconds(d.nanos());
}

}  // namespace idem

#endif  // IDEM_COMMON_PROTO_TIME_H_
