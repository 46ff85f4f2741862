#include "server/rpc/admin_calls.h"

#include <utility>
#include <vector>

#include "google/protobuf/io/coded_stream.h"
#include "server/base/log.h"
#include "server/rpc/page_token.h"
#include "server/wire/convert.h"
#include "server/wire/snapshot_validation.h"

namespace idem {

void ResolveRecord(const ServiceContext& c, const RecordKey& key,
                   ResolveCommand cmd, const std::string& caller,
                   const char* via, pb::ResolveResponse* resp, AdminDone done) {
  // With auth on, the record names who really resolved it.
  if (c.auth != nullptr) cmd.actor = caller;
  const std::string actor = cmd.actor;
  const std::string reason = cmd.reason;
  c.calls->Resolve(
      key, std::move(cmd),
      [metrics = c.metrics, key, actor, reason, via, resp,
       done = std::move(done)](absl::StatusOr<Record> record) {
        if (!record.ok()) return done(record.status());
        if (metrics != nullptr) metrics->Resolved("operator");
        LogFields fields = {
            {"tenant", key.tenant}, {"operation", key.operation},
            {"key", key.key},       {"status", StatusName(record->status)},
            {"actor", actor},       {"reason", reason}};
        if (via != nullptr) fields.emplace_back("via", via);
        Log(LogLevel::kInfo, "resolved", fields);
        ToProto(*record, /*with_result=*/true, resp->mutable_record());
        done(absl::OkStatus());
      });
}

// The SQL CHECKs bound an audit entry's reason and actor, so a full History
// page stays within List's byte bound without a cut of its own (an entry's
// time, statuses and token take well under 64 bytes).
static_assert(kMaxPageSize * (kMaxReasonBytes + kMaxActorBytes + 64) +
                      kMaxPageTokenBytes <=
                  kMaxListPageBytes,
              "a History page could pass kMaxListPageBytes");

void HistoryPage(const ServiceContext& c, const HistoryQuery& query,
                 pb::HistoryResponse* resp, AdminDone done) {
  // One entry more than the page holds: one left over says more follow.
  HistoryQuery fetch = query;
  fetch.limit = query.limit + 1;
  c.admin_store->History(
      fetch, [query, resp, done = std::move(done)](
                 absl::StatusOr<std::vector<AuditEntry>> entries) {
        if (!entries.ok()) return done(entries.status());
        for (const AuditEntry& e : *entries) {
          if (resp->entries_size() == query.limit) {
            resp->set_next_page_token(
                EncodeHistoryToken(query.key, (*entries)[query.limit - 1].id));
            break;
          }
          ToProto(e, resp->add_entries());
        }
        done(absl::OkStatus());
      });
}

void ListPage(const ServiceContext& c, ListQuery query,
              const std::string& page_token, pb::ListResponse* resp,
              AdminDone done) {
  if (!page_token.empty()) {
    absl::StatusOr<ListCursor> after = DecodePageToken(page_token, query);
    if (!after.ok()) return done(after.status());
    query.after = *after;
  }
  // One record more than the page holds, and the store's byte bound
  // (results are up to --max-snapshot-bytes each): a record left over
  // says that more follow. The exact cut is made here, on the encoded
  // records.
  ListQuery fetch = query;
  fetch.limit = query.limit + 1;
  fetch.max_bytes = kMaxListPageBytes;
  c.admin_store->List(fetch, [query, resp, done = std::move(done)](
                                 absl::StatusOr<std::vector<Record>> records) {
    if (!records.ok()) return done(records.status());
    // The records that fit with room for the token; the first one
    // always, however large, so that paging moves on.
    size_t page_bytes = 0;
    for (const Record& r : *records) {
      if (resp->records_size() == query.limit) break;
      pb::Record* out = resp->add_records();
      ToProto(r, /*with_result=*/true, out);
      const size_t size = out->ByteSizeLong();
      const size_t entry =
          1 + google::protobuf::io::CodedOutputStream::VarintSize64(size) +
          size;
      if (resp->records_size() > 1 &&
          page_bytes + entry > kMaxListPageBytes - kMaxPageTokenBytes) {
        resp->mutable_records()->RemoveLast();
        break;
      }
      page_bytes += entry;
    }
    const size_t kept = static_cast<size_t>(resp->records_size());
    if (kept < records->size()) {
      const Record& last = (*records)[kept - 1];
      resp->set_next_page_token(
          EncodePageToken(query, ListCursor{last.updated_at, last.key}));
    }
    done(absl::OkStatus());
  });
}

}  // namespace idem
