// idem-quickstart: walks through the life of one idempotency record against a
// running sidecar (docs/spec.md#transitions): the first Begin acquires, the
// holder completes, a retry gets the stored result replayed byte for byte,
// and a different request under the same key is rejected as a mismatch.
// Exit code 0 if every step behaved as designed, 1 if one did not, 2 on bad
// flags, 3 if the sidecar cannot be reached.
#include <grpcpp/grpcpp.h>

#include <CLI/CLI.hpp>
#include <cstdint>
#include <exception>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/cli_format.h"
#include "idempotency/v1/idempotency.grpc.pb.h"

namespace idem::cli {
namespace {

constexpr char kTenant[] = "demo";
constexpr char kOperation[] = "create-payment";

// Returns 16 random bytes as 32 hex digits.
std::string RandomHex() {
  std::random_device rd;
  std::string bytes;
  for (int i = 0; i < 4; ++i) {
    const uint32_t v = rd();
    bytes.append(reinterpret_cast<const char*>(&v), sizeof(v));
  }
  return absl::BytesToHexString(bytes);
}

class Walkthrough {
 public:
  Walkthrough(std::string addr, absl::Duration timeout)
      : addr_(std::move(addr)),
        timeout_(timeout),
        stub_(pb::Idempotency::NewStub(
            grpc::CreateChannel(addr_, grpc::InsecureChannelCredentials()))) {
    key_.set_tenant(kTenant);
    key_.set_operation(kOperation);
    key_.set_key(absl::StrCat("quickstart-", RandomHex()));
  }

  // Runs every step; returns the exit code.
  int Run() {
    std::cout << "idem-quickstart: talking to the sidecar at " << addr_
              << "\nrecord " << FormatKey(key_) << "\n\n";
    // A business service fingerprints its normalised request (e.g. with
    // SHA-256); any 1-64 bytes will do here.
    const std::string hash = "sha256:amount=1000;currency=EUR;to=alice";
    const std::string other_hash = "sha256:amount=9999;currency=EUR;to=mallory";

    // Step 1: the first attempt owns the record.
    Step("Begin with request hash A (the first attempt)");
    pb::BeginResponse first;
    if (!Begin(hash, &first)) return exit_code_;
    if (first.outcome() != pb::OUTCOME_ACQUIRED || first.fencing_token() <= 0 ||
        first.record().status() != pb::STATUS_PROCESSING) {
      return Bad(absl::StrCat("want ACQUIRED with a fencing token, got ",
                              pb::Outcome_Name(first.outcome())));
    }
    Good(absl::StrCat("ACQUIRED with fencing token ", first.fencing_token(),
                      ": this attempt may write (and should store the "
                      "token with its write)"));

    // Step 2: the holder stores its result.
    const std::string body =
        absl::StrCat("{\"payment_id\":\"pay_", RandomHex().substr(0, 12),
                     "\",\"status\":\"captured\"}");
    pb::Snapshot result;
    result.set_code(201);
    result.set_content_type("application/json");
    result.set_body(body);
    Step(absl::StrCat("Complete with 201 ", body));
    pb::CompleteRequest complete;
    *complete.mutable_key() = key_;
    complete.set_fencing_token(first.fencing_token());
    *complete.mutable_result() = result;
    pb::CompleteResponse completed;
    grpc::Status s = stub_->Complete(Context().get(), complete, &completed);
    if (!s.ok()) return RpcFailed("Complete", s);
    if (completed.record().status() != pb::STATUS_SUCCEEDED) {
      return Bad(absl::StrCat("want SUCCEEDED, got ",
                              StatusName(completed.record().status())));
    }
    Good("SUCCEEDED: the result is stored");

    // Step 3: a retry of the same request gets the stored result back.
    Step("Begin again with request hash A (a client retry)");
    pb::BeginResponse replay;
    if (!Begin(hash, &replay)) return exit_code_;
    if (replay.outcome() != pb::OUTCOME_COMPLETED) {
      return Bad(absl::StrCat("want COMPLETED, got ",
                              pb::Outcome_Name(replay.outcome())));
    }
    const pb::Snapshot& got = replay.record().result();
    if (got.code() != 201 || got.body() != body ||
        got.content_type() != result.content_type() ||
        replay.fencing_token() != 0) {
      return Bad(absl::StrCat("want the stored snapshot (201, ", body,
                              "), got (", got.code(), ", ",
                              FormatBody(got.body()), ")"));
    }
    Good(absl::StrCat("COMPLETED: replayed 201 ", got.body(),
                      " byte for byte; do not write again"));

    // Step 4: another request under the same key is rejected.
    Step("Begin with request hash B under the same key (a different request)");
    pb::BeginResponse mismatch;
    if (!Begin(other_hash, &mismatch)) return exit_code_;
    if (mismatch.outcome() != pb::OUTCOME_MISMATCH) {
      return Bad(absl::StrCat("want MISMATCH, got ",
                              pb::Outcome_Name(mismatch.outcome())));
    }
    if (mismatch.record().has_result() || mismatch.fencing_token() != 0) {
      return Bad("MISMATCH must not carry the stored result or a token");
    }
    Good("MISMATCH without the result: reject it (like HTTP 422)");

    std::cout << "\nAll " << step_
              << " steps behaved as designed. Look at the record with:\n"
              << "  idemctl --addr " << addr_ << " get --tenant " << kTenant
              << " --operation " << kOperation << " --key " << key_.key()
              << "\n";
    return kExitOk;
  }

 private:
  std::unique_ptr<grpc::ClientContext> Context() const {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
    return ctx;
  }

  void Step(const std::string& what) {
    std::cout << ++step_ << ". " << what << "\n";
  }
  void Good(const std::string& what) { std::cout << "   ok: " << what << "\n"; }
  int Bad(const std::string& what) {
    std::cout << "   UNEXPECTED: " << what << "\n";
    std::cerr << "idem-quickstart: step " << step_ << " failed: " << what
              << "\n";
    return exit_code_ = kExitRefused;
  }
  int RpcFailed(const std::string& rpc, const grpc::Status& s) {
    const bool unreachable = ExitCodeFor(s.error_code()) == kExitUnavailable;
    std::cout << "   " << rpc << " failed: " << CodeName(s.error_code()) << ": "
              << s.error_message() << "\n";
    std::cerr << "idem-quickstart: " << rpc << ": " << CodeName(s.error_code())
              << ": " << s.error_message() << "\n";
    if (unreachable) {
      std::cerr << "idem-quickstart: is the sidecar running at " << addr_
                << "? (--addr or IDEM_ADDR)\n";
    }
    return exit_code_ = unreachable ? kExitUnavailable : kExitRefused;
  }

  // Calls Begin; on an RPC error reports it and returns false.
  bool Begin(const std::string& hash, pb::BeginResponse* resp) {
    pb::BeginRequest req;
    *req.mutable_key() = key_;
    req.set_request_hash(hash);
    grpc::Status s = stub_->Begin(Context().get(), req, resp);
    if (!s.ok()) {
      RpcFailed("Begin", s);
      return false;
    }
    return true;
  }

  const std::string addr_;
  const absl::Duration timeout_;
  std::unique_ptr<pb::Idempotency::Stub> stub_;
  pb::RecordKey key_;
  int step_ = 0;
  int exit_code_ = kExitOk;
};

int Main(int argc, char** argv) {
  CLI::App app{
      "Walks through one idempotency record against a running sidecar: "
      "Begin acquires, Complete stores the result, a retry replays it byte "
      "for byte, and a different request under the same key is a MISMATCH.",
      "idem-quickstart"};
  app.footer(
      "Exit codes: 0 every step behaved as designed; 1 a step did not; "
      "2 usage; 3 the sidecar is unreachable.");
  std::string addr = "127.0.0.1:50051";
  std::string timeout = "5s";
  app.add_option("--addr", addr, "Sidecar address HOST:PORT")
      ->envname("IDEM_ADDR")
      ->capture_default_str();
  app.add_option("--timeout", timeout, "Deadline of each call, e.g. 5s")
      ->check(
          [](const std::string& text) -> std::string {
            absl::StatusOr<absl::Duration> d = ParseCliDuration(text);
            return d.ok() ? "" : std::string(d.status().message());
          },
          "DURATION")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? kExitOk : kExitUsage;
  }
  Walkthrough walk(addr, *ParseCliDuration(timeout));
  return walk.Run();
}

}  // namespace
}  // namespace idem::cli

int main(int argc, char** argv) {
  try {
    return idem::cli::Main(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "idem-quickstart: " << e.what() << "\n";
    return idem::cli::kExitUnavailable;
  }
}
