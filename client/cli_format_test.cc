#include "client/cli_format.h"

#include <string>

#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"

namespace idem::cli {
namespace {

TEST(ExitCodeTest, FollowsTheDesign) {
  EXPECT_EQ(ExitCodeFor(grpc::StatusCode::OK), 0);
  EXPECT_EQ(ExitCodeFor(grpc::StatusCode::NOT_FOUND), 1);
  EXPECT_EQ(ExitCodeFor(grpc::StatusCode::FAILED_PRECONDITION), 1);
  EXPECT_EQ(ExitCodeFor(grpc::StatusCode::ALREADY_EXISTS), 1);
  EXPECT_EQ(ExitCodeFor(grpc::StatusCode::ABORTED), 1);
  EXPECT_EQ(ExitCodeFor(grpc::StatusCode::PERMISSION_DENIED), 1);
  EXPECT_EQ(ExitCodeFor(grpc::StatusCode::UNAUTHENTICATED), 1);
  EXPECT_EQ(ExitCodeFor(grpc::StatusCode::INVALID_ARGUMENT), 2);
  EXPECT_EQ(ExitCodeFor(grpc::StatusCode::UNAVAILABLE), 3);
  EXPECT_EQ(ExitCodeFor(grpc::StatusCode::DEADLINE_EXCEEDED), 3);
  EXPECT_EQ(ExitCodeFor(grpc::StatusCode::UNIMPLEMENTED), 3);
  EXPECT_EQ(ExitCodeFor(grpc::StatusCode::INTERNAL), 3);
  EXPECT_EQ(CodeName(grpc::StatusCode::FAILED_PRECONDITION),
            "FAILED_PRECONDITION");
}

TEST(ParseStatusTest, AcceptsEveryCasing) {
  EXPECT_EQ(*ParseStatus("unknown"), pb::STATUS_UNKNOWN);
  EXPECT_EQ(*ParseStatus("UNKNOWN"), pb::STATUS_UNKNOWN);
  EXPECT_EQ(*ParseStatus("status_succeeded"), pb::STATUS_SUCCEEDED);
  EXPECT_EQ(*ParseStatus("Processing"), pb::STATUS_PROCESSING);
  EXPECT_EQ(*ParseStatus("failed"), pb::STATUS_FAILED);
  EXPECT_FALSE(ParseStatus("unspecified").ok());
  EXPECT_FALSE(ParseStatus("").ok());
  EXPECT_FALSE(ParseStatus("done").ok());
  for (pb::Status s : {pb::STATUS_PROCESSING, pb::STATUS_SUCCEEDED,
                       pb::STATUS_FAILED, pb::STATUS_UNKNOWN}) {
    EXPECT_EQ(*ParseStatus(StatusName(s)), s);
  }
  EXPECT_EQ(StatusName(pb::STATUS_UNSPECIFIED), "-");
}

TEST(ParseCliDurationTest, PositiveDurationsOnly) {
  EXPECT_EQ(*ParseCliDuration("10m"), absl::Minutes(10));
  EXPECT_EQ(*ParseCliDuration("1h30m"), absl::Minutes(90));
  EXPECT_EQ(*ParseCliDuration("500ms"), absl::Milliseconds(500));
  EXPECT_EQ(*ParseCliDuration("5s"), absl::Seconds(5));
  EXPECT_FALSE(ParseCliDuration("0").ok());
  EXPECT_FALSE(ParseCliDuration("-5s").ok());
  EXPECT_FALSE(ParseCliDuration("10").ok());
  EXPECT_FALSE(ParseCliDuration("ten minutes").ok());
  EXPECT_FALSE(ParseCliDuration("inf").ok());
}

TEST(FormatBodyTest, TextOrBase64) {
  EXPECT_EQ(FormatBody("{\"ok\":true}"), "{\"ok\":true}");
  EXPECT_EQ(FormatBody("gr\xc3\xbc\xc3\x9f"
                       "e\n"),
            "gr\xc3\xbc\xc3\x9f"
            "e\n");
  EXPECT_EQ(FormatBody(std::string("a\0b", 3)), "<3 bytes, base64: YQBi>");
  EXPECT_EQ(FormatBody("\xff\xfe"), "<2 bytes, base64: //4=>");
  EXPECT_EQ(FormatBody(""), "<empty>");
  EXPECT_FALSE(IsPrintableUtf8("\xc3"));          // truncated sequence
  EXPECT_FALSE(IsPrintableUtf8("\xc0\xaf"));      // overlong
  EXPECT_FALSE(IsPrintableUtf8("\xed\xa0\x80"));  // surrogate
  EXPECT_FALSE(IsPrintableUtf8("\x1b[31m"));      // terminal escape
  EXPECT_TRUE(IsPrintableUtf8("\xf0\x9f\x98\x80 tab\t"));
}

TEST(FormatTest, RecordBlockNamesEveryField) {
  pb::Record r;
  r.mutable_key()->set_tenant("t");
  r.mutable_key()->set_operation("create-payment");
  r.mutable_key()->set_key("k-1");
  r.set_status(pb::STATUS_SUCCEEDED);
  r.set_fencing_token(3);
  r.set_attempt(2);
  r.set_request_hash("ab");
  r.mutable_updated_at()->set_seconds(1700000000);
  r.set_resolved_by("alice");
  r.set_resolve_reason("found in ledger");
  r.mutable_result()->set_code(201);
  r.mutable_result()->set_content_type("application/json");
  r.mutable_result()->set_body("{\"id\":1}");
  (*r.mutable_result()->mutable_headers())["x-tag"] = "v";
  const std::string out =
      FormatRecord(r, absl::FromUnixSeconds(1700000000) + absl::Minutes(3));
  for (const char* want :
       {"status               SUCCEEDED\n", "fencing_token        3\n",
        "attempt              2\n", "request_hash         6162\n",
        "updated_at           2023-11-14T22:13:20.000Z (3m ago)\n",
        "lease_expires_at     -\n", "resolved_by          alice\n",
        "resolve_reason       found in ledger\n", "result.code          201\n",
        "result.content_type  application/json\n",
        "result.header        x-tag: v\n",
        "result.body          {\"id\":1}\n"}) {
    EXPECT_NE(out.find(want), std::string::npos) << want << " in\n" << out;
  }
  EXPECT_EQ(FormatKey(r.key()), "t/create-payment/k-1");
}

TEST(FormatTest, TablesAlignColumns) {
  EXPECT_EQ(FormatTable({{"A", "BB", "C"}, {"long", "x", "y"}}),
            "A     BB  C\nlong  x   y\n");
  pb::HistoryResponse h;
  pb::AuditEntry* e = h.add_entries();
  e->set_from(pb::STATUS_PROCESSING);
  e->set_to(pb::STATUS_UNKNOWN);
  e->set_actor("reaper");
  e->set_fencing_token(1);
  e->mutable_at()->set_seconds(0);
  const std::string out = FormatHistory(h);
  EXPECT_NE(out.find("PROCESSING"), std::string::npos) << out;
  EXPECT_NE(out.find("1970-01-01T00:00:00.000Z"), std::string::npos) << out;
  EXPECT_EQ(FormatRecordTable({}, absl::Now()), "");
  pb::ListResponse list;
  list.add_records()->mutable_key()->set_key("only-key");
  EXPECT_NE(FormatRecordTable(list.records(), absl::Now()).find("only-key"),
            std::string::npos);
}

TEST(JsonTest, ProtoFieldNamesAndDefaults) {
  pb::GetResponse resp;
  resp.mutable_record()->set_status(pb::STATUS_UNKNOWN);
  resp.mutable_record()->set_fencing_token(7);
  const std::string json = *ToJson(resp);
  EXPECT_NE(json.find("\"fencing_token\":\"7\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"status\":\"STATUS_UNKNOWN\""), std::string::npos);
  EXPECT_NE(json.find("\"retryable\":false"), std::string::npos);
  EXPECT_EQ(json.find('\n'), std::string::npos);
  pb::GetResponse back;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &back).ok());
  EXPECT_EQ(back.record().fencing_token(), 7);
}

TEST(JsonTest, Validate) {
  EXPECT_TRUE(ValidateJson("{\"ok\":true}").ok());
  EXPECT_TRUE(ValidateJson("[1, 2]").ok());
  EXPECT_TRUE(ValidateJson("\"text\"").ok());
  EXPECT_FALSE(ValidateJson("").ok());
  EXPECT_FALSE(ValidateJson("  ").ok());
  EXPECT_FALSE(ValidateJson("{ok:true}").ok());
  EXPECT_FALSE(ValidateJson("{\"a\":1").ok());
  EXPECT_FALSE(ValidateJson("not json").ok());
  EXPECT_TRUE(
      ValidateJson(" {\"a\": [true, false, null, -1.5e+3, 0, \"\\u00e9\\n\"]} ")
          .ok());
  EXPECT_TRUE(ValidateJson("{\"gr\xc3\xbc\xc3\x9f\":{}}").ok());
  EXPECT_FALSE(ValidateJson("[1,]").ok());
  EXPECT_FALSE(ValidateJson("{\"a\":1,}").ok());
  EXPECT_FALSE(ValidateJson("01").ok());
  EXPECT_FALSE(ValidateJson("1.").ok());
  EXPECT_FALSE(ValidateJson("\"tab\there\"").ok());
  EXPECT_FALSE(ValidateJson("\"\\x\"").ok());
  EXPECT_FALSE(ValidateJson("\"\\u12\"").ok());
  EXPECT_FALSE(ValidateJson("\"\xff\"").ok());
  EXPECT_FALSE(ValidateJson("{} {}").ok());
  EXPECT_FALSE(ValidateJson("tru").ok());
  EXPECT_FALSE(ValidateJson(std::string(1000, '[')).ok());
  EXPECT_NE(ValidateJson("{\"a\" 1}").message().find("column 6"),
            std::string::npos)
      << ValidateJson("{\"a\" 1}");
}

}  // namespace
}  // namespace idem::cli
