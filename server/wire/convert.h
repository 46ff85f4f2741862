// Conversions between the public API's messages and the state machine's types.
#ifndef IDEM_SERVER_WIRE_CONVERT_H_
#define IDEM_SERVER_WIRE_CONVERT_H_

#include "common/proto_time.h"
#include "idempotency/v1/idempotency.pb.h"
#include "statemachine/record.h"

namespace idem {

namespace pb = ::idempotency::v1;

RecordKey FromProto(const pb::RecordKey& key);
Snapshot FromProto(const pb::Snapshot& snapshot);
pb::Status ToProto(Status status);
pb::Outcome ToProto(Outcome outcome);
// Fills `out`; the result snapshot is left out when `with_result` is false
// (MISMATCH must not leak it).
void ToProto(const Record& record, bool with_result, pb::Record* out);
void ToProto(const AuditEntry& entry, pb::AuditEntry* out);
// Returns false for STATUS_UNSPECIFIED and unknown values.
bool FromProto(pb::Status status, Status* out);

}  // namespace idem

#endif  // IDEM_SERVER_WIRE_CONVERT_H_
