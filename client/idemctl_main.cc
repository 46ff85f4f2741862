// idemctl: the operator CLI of the idempotency sidecar (docs/spec.md#idemctl).
// Reads records, lists them, settles UNKNOWN ones, previews what the
// reconciler would do with them, shows their audit trail and checks health.
// Tables for people, --json (one document on stdout) for scripts; exit codes 0
// ok, 1 not found or refused by state, 2 usage, 3 unavailable.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/cli_format.h"
#include "common/proto_time.h"
#include "google/protobuf/struct.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "idempotency/v1/idempotency.grpc.pb.h"
#include "idempotency/v1/reconciler.grpc.pb.h"
#include "server/base/config.h"
#include "server/core/probe_dial.h"
#include "server/main/flag_groups.h"
#include "server/wire/snapshot_validation.h"

namespace idem::cli {
namespace {

using ::grpc::health::v1::HealthCheckRequest;
using ::grpc::health::v1::HealthCheckResponse;

constexpr char kDefaultAddr[] = "127.0.0.1:50051";

// Flags shared by every command.
struct Globals {
  std::string addr = kDefaultAddr;
  bool json = false;
  std::string timeout = "5s";
  absl::Duration deadline = absl::Seconds(5);
  bool tls = false;
  std::string tls_ca;
  // --tls-cert and --tls-key: the client certificate (mutual TLS).
  TlsKeyPairFlags client_cert;
  std::string tls_server_name;
  std::string token_file;
  // Filled from the flags above before any call.
  std::string token;
  std::shared_ptr<grpc::ChannelCredentials> credentials;
};

// Reads a PEM or token file named by `--flag`.
absl::StatusOr<std::string> ReadFlagFile(const std::string& flag,
                                         const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, "=", path, ": cannot read the file"));
  }
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Sets g->credentials and g->token from the TLS and token flags.
absl::Status PrepareCredentials(Globals* g) {
  if (!g->token_file.empty()) {
    absl::StatusOr<std::string> token =
        ReadFlagFile("token-file", g->token_file);
    if (!token.ok()) return token.status();
    g->token = std::string(absl::StripAsciiWhitespace(*token));
  } else if (const char* env = std::getenv("IDEM_TOKEN")) {
    g->token = env;
  }
  const bool tls = g->tls || !g->tls_ca.empty() ||
                   !g->client_cert.cert.empty() || !g->client_cert.key.empty();
  if (!tls) {
    g->credentials = grpc::InsecureChannelCredentials();
    return absl::OkStatus();
  }
  if (g->client_cert.cert.empty() != g->client_cert.key.empty()) {
    return absl::InvalidArgumentError(
        "--tls-cert and --tls-key: give both for a client certificate");
  }
  grpc::SslCredentialsOptions options;
  for (const auto& [flag, path, out] :
       {std::tuple{"tls-ca", g->tls_ca, &options.pem_root_certs},
        std::tuple{"tls-cert", g->client_cert.cert, &options.pem_cert_chain},
        std::tuple{"tls-key", g->client_cert.key, &options.pem_private_key}}) {
    if (path.empty()) continue;
    absl::StatusOr<std::string> pem = ReadFlagFile(flag, path);
    if (!pem.ok()) return pem.status();
    *out = *pem;
  }
  g->credentials = grpc::SslCredentials(options);
  return absl::OkStatus();
}

// --tenant, --operation, --key.
struct KeyFlags {
  std::string tenant;
  std::string operation;
  std::string key;

  pb::RecordKey Proto() const {
    pb::RecordKey k;
    k.set_tenant(tenant);
    k.set_operation(operation);
    k.set_key(key);
    return k;
  }
};

struct ListFlags {
  std::string status;
  std::string older_than;
  std::string tenant;
  std::string operation;
  int page_size = 0;
  std::string page_token;
  bool all = false;
};

struct ReconcileFlags {
  std::string probe;
  std::string config;
  size_t max_snapshot_bytes = 256 * 1024;
  std::string probe_timeout = "2s";
  std::string tenant;
  std::string operation;
  std::string older_than;
  bool dry_run = false;
};

struct ResolveFlags {
  KeyFlags key;
  std::string to;
  std::string reason;
  std::string result_file;
  std::string result_json;
  std::string content_type;
  int code = 0;
  bool retryable = false;
  std::string actor;
  int64_t expected_token = 0;
  bool force = false;
  bool yes = false;
  // Set after parsing: which optional flags were given.
  bool has_result_file = false;
  bool has_result_json = false;
  bool has_content_type = false;
  bool has_code = false;
};

std::string DefaultActor() {
  const char* user = std::getenv("USER");
  return user != nullptr && *user != '\0' ? user : "operator";
}

// A CLI11 validator: "" if `text` is a positive duration, else why not.
std::string CheckDuration(const std::string& text) {
  absl::StatusOr<absl::Duration> d = ParseCliDuration(text);
  return d.ok() ? "" : std::string(d.status().message());
}

std::string CheckStatus(const std::string& text) {
  absl::StatusOr<pb::Status> s = ParseStatus(text);
  return s.ok() ? "" : std::string(s.status().message());
}

std::string CheckResolveTarget(const std::string& text) {
  absl::StatusOr<pb::Status> s = ParseStatus(text);
  if (s.ok() && (*s == pb::STATUS_SUCCEEDED || *s == pb::STATUS_FAILED)) {
    return "";
  }
  return "want succeeded or failed";
}

int UsageError(const std::string& message) {
  std::cerr << "idemctl: " << message << "\n"
            << "Run with --help for more information.\n";
  return kExitUsage;
}

grpc::ChannelArguments ChannelArgs(const Globals& g) {
  grpc::ChannelArguments args;
  // No bound of our own on answers: the sidecar keeps List pages under
  // 4 MiB, but one record alone can be as large as the requests the sidecar
  // accepts (4 MiB, or twice a larger --max-snapshot-bytes), which idemctl
  // cannot know.
  args.SetMaxReceiveMessageSize(-1);
  if (!g.tls_server_name.empty()) {
    args.SetSslTargetNameOverride(g.tls_server_name);
  }
  return args;
}

// The channel and stubs of one sidecar address.
class Client {
 public:
  explicit Client(const Globals& globals)
      : globals_(globals),
        channel_(grpc::CreateCustomChannel(globals.addr, globals.credentials,
                                           ChannelArgs(globals))),
        data_(pb::Idempotency::NewStub(channel_)),
        admin_(pb::IdempotencyAdmin::NewStub(channel_)),
        health_(grpc::health::v1::Health::NewStub(channel_)) {}

  // Returns a context whose deadline is --timeout from now.
  std::unique_ptr<grpc::ClientContext> Context() const {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(absl::ToChronoTime(absl::Now() + globals_.deadline));
    if (!globals_.token.empty()) {
      ctx->AddMetadata("authorization", "Bearer " + globals_.token);
    }
    return ctx;
  }

  pb::Idempotency::Stub& data() { return *data_; }
  pb::IdempotencyAdmin::Stub& admin() { return *admin_; }
  grpc::health::v1::Health::Stub& health() { return *health_; }

  // Prints `status` of the call `what` on stderr and returns its exit code.
  int Error(const std::string& what, const grpc::Status& status) const {
    std::cerr << "idemctl: " << what << ": " << CodeName(status.error_code())
              << ": " << status.error_message() << "\n";
    switch (status.error_code()) {
      case grpc::StatusCode::UNAVAILABLE:
      case grpc::StatusCode::DEADLINE_EXCEEDED:
        std::cerr << "idemctl: is the sidecar running at " << globals_.addr
                  << "? (--addr or IDEM_ADDR; --timeout is " << globals_.timeout
                  << ")\n";
        break;
      case grpc::StatusCode::UNIMPLEMENTED:
        std::cerr << "idemctl: the sidecar at " << globals_.addr
                  << " does not implement " << what << "\n";
        break;
      default:
        break;
    }
    return ExitCodeFor(status.error_code());
  }

 private:
  const Globals& globals_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::Idempotency::Stub> data_;
  std::unique_ptr<pb::IdempotencyAdmin::Stub> admin_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_;
};

// Writes `message` as one JSON document on stdout.
int PrintJson(const google::protobuf::Message& message, int exit_code) {
  absl::StatusOr<std::string> json = ToJson(message);
  if (!json.ok()) {
    std::cerr << "idemctl: " << json.status().message() << "\n";
    return kExitUnavailable;
  }
  std::cout << *json << "\n";
  return exit_code;
}

void AddKeyFlags(CLI::App* cmd, KeyFlags* key) {
  cmd->add_option("--tenant", key->tenant, "Tenant of the record")->required();
  cmd->add_option("--operation", key->operation,
                  "Operation of the record, e.g. create-payment")
      ->required();
  cmd->add_option("--key", key->key, "The client's idempotency key")
      ->required();
}

int RunGet(const Globals& g, const KeyFlags& flags) {
  Client client(g);
  pb::GetRequest req;
  *req.mutable_key() = flags.Proto();
  pb::GetResponse resp;
  grpc::Status s = client.data().Get(client.Context().get(), req, &resp);
  if (!s.ok()) return client.Error("get", s);
  if (g.json) return PrintJson(resp, kExitOk);
  std::cout << FormatRecord(resp.record(), absl::Now());
  return kExitOk;
}

int RunList(const Globals& g, const ListFlags& flags) {
  pb::ListRequest req;
  req.set_tenant(flags.tenant);
  req.set_operation(flags.operation);
  if (!flags.status.empty()) req.set_status(*ParseStatus(flags.status));
  if (!flags.older_than.empty()) {
    *req.mutable_older_than() =
        DurationToProto(*ParseCliDuration(flags.older_than));
  }
  req.set_page_size(flags.page_size);
  req.set_page_token(flags.page_token);

  Client client(g);
  pb::ListResponse all;
  std::set<std::string> seen_tokens;
  while (true) {
    pb::ListResponse page;
    grpc::Status s = client.admin().List(client.Context().get(), req, &page);
    if (!s.ok()) return client.Error("list", s);
    for (pb::Record& r : *page.mutable_records()) {
      all.add_records()->Swap(&r);
    }
    if (!flags.all || page.next_page_token().empty()) {
      all.set_next_page_token(page.next_page_token());
      break;
    }
    if (!seen_tokens.insert(page.next_page_token()).second) {
      std::cerr << "idemctl: list: the sidecar returned page token \""
                << page.next_page_token() << "\" twice; stopping\n";
      return kExitUnavailable;
    }
    req.set_page_token(page.next_page_token());
  }
  if (g.json) return PrintJson(all, kExitOk);

  if (all.records().empty()) {
    std::cout << "no records match\n";
  } else {
    std::cout << FormatRecordTable(all.records(), absl::Now())
              << all.records_size()
              << (all.records_size() == 1 ? " record" : " records") << "\n";
  }
  if (!all.next_page_token().empty()) {
    std::cout << "more: repeat with --page-token " << all.next_page_token()
              << " (or --all for every page)\n";
  }
  return kExitOk;
}

// Fills `result` from --result-json / --result-file / --code /
// --content-type; returns false (after printing why) on a usage error.
bool BuildResult(const ResolveFlags& f, pb::Status to, bool* has_result,
                 pb::Snapshot* result) {
  *has_result = false;
  if (f.has_result_json) {
    absl::Status valid = ValidateJson(f.result_json);
    if (!valid.ok()) {
      UsageError(absl::StrCat("--result-json: ", valid.message()));
      return false;
    }
    result->set_body(f.result_json);
    result->set_content_type("application/json");
    *has_result = true;
  } else if (f.has_result_file) {
    std::ifstream in(f.result_file, std::ios::binary);
    if (!in) {
      UsageError(absl::StrCat("--result-file: cannot read ", f.result_file,
                              ": ", std::strerror(errno)));
      return false;
    }
    std::string body((std::istreambuf_iterator<char>(in)),
                     std::istreambuf_iterator<char>());
    if (in.bad()) {
      UsageError(absl::StrCat("--result-file: cannot read ", f.result_file));
      return false;
    }
    result->set_body(std::move(body));
    result->set_content_type("application/octet-stream");
    *has_result = true;
  }
  if (f.has_content_type) {
    if (!*has_result) {
      UsageError("--content-type needs --result-json or --result-file");
      return false;
    }
    result->set_content_type(f.content_type);
  }
  if (to == pb::STATUS_SUCCEEDED && !*has_result) {
    UsageError(
        "resolve --to succeeded needs --result-json or --result-file: the "
        "snapshot every later Begin replays");
    return false;
  }
  if (f.has_code) {
    result->set_code(f.code);
    *has_result = true;
  } else if (*has_result) {
    result->set_code(to == pb::STATUS_SUCCEEDED ? 200 : 0);
  }
  return true;
}

// Asks on the terminal; returns true iff the operator answers y or yes.
bool Confirm(const std::string& question) {
  std::cerr << question << " [y/N] " << std::flush;
  std::string answer;
  if (!std::getline(std::cin, answer)) return false;
  answer = absl::AsciiStrToLower(absl::StripAsciiWhitespace(answer));
  return answer == "y" || answer == "yes";
}

int RunResolve(const Globals& g, const ResolveFlags& f) {
  const pb::Status to = *ParseStatus(f.to);
  if (f.retryable && to != pb::STATUS_FAILED) {
    return UsageError("--retryable only goes with --to failed");
  }
  pb::ResolveRequest req;
  *req.mutable_key() = f.key.Proto();
  req.set_to(to);
  bool has_result = false;
  if (!BuildResult(f, to, &has_result, req.mutable_result())) {
    return kExitUsage;
  }
  if (!has_result) req.clear_result();
  req.set_retryable(f.retryable);
  req.set_reason(f.reason);
  req.set_actor(f.actor);
  req.set_expected_fencing_token(f.expected_token);
  req.set_force(f.force);

  Client client(g);
  pb::GetRequest get;
  *get.mutable_key() = req.key();
  pb::GetResponse current;
  grpc::Status s = client.data().Get(client.Context().get(), get, &current);
  if (!s.ok()) return client.Error("resolve: get", s);
  // With --json, stdout carries only the ResolveResponse.
  std::ostream& info = g.json ? std::cerr : std::cout;
  info << "current record:\n" << FormatRecord(current.record(), absl::Now());

  const pb::Record& rec = current.record();
  if (rec.status() == pb::STATUS_PROCESSING && !f.force) {
    std::cerr << "idemctl: resolve: " << FormatKey(rec.key())
              << " is PROCESSING: its holder may still be writing. Wait for "
                 "the lease to run out, or pass --force if you know it has "
                 "stopped.\n";
    return kExitRefused;
  }
  if (!f.yes) {
    if (!isatty(STDIN_FILENO)) {
      std::cerr << "idemctl: resolve: refusing without confirmation: stdin "
                   "is not a terminal; pass --yes to resolve non-"
                   "interactively. Nothing was changed.\n";
      return kExitUsage;
    }
    std::string question = absl::StrCat(
        "Resolve ", FormatKey(rec.key()), " (", StatusName(rec.status()),
        ", fencing token ", rec.fencing_token(), ") to ", StatusName(to));
    if (req.has_result()) {
      absl::StrAppend(&question, " with code ", req.result().code(), ", ",
                      req.result().body().size(), " bytes of ",
                      req.result().content_type().empty()
                          ? "unspecified content type"
                          : req.result().content_type());
    }
    if (f.retryable) absl::StrAppend(&question, ", retryable");
    absl::StrAppend(&question, "?");
    if (!Confirm(question)) {
      std::cerr << "idemctl: resolve: not confirmed; nothing was changed.\n";
      return kExitRefused;
    }
  }
  // Guard against a change between what was shown and the write.
  if (req.expected_fencing_token() == 0) {
    req.set_expected_fencing_token(rec.fencing_token());
  }
  pb::ResolveResponse resp;
  s = client.admin().Resolve(client.Context().get(), req, &resp);
  if (!s.ok()) return client.Error("resolve", s);
  if (g.json) return PrintJson(resp, kExitOk);
  std::cout << "\nresolved " << FormatKey(resp.record().key()) << " to "
            << StatusName(resp.record().status()) << ":\n"
            << FormatRecord(resp.record(), absl::Now());
  return kExitOk;
}

// What the sidecar's reconcile loop would do with one UNKNOWN record.
struct Preview {
  pb::Record record;
  grpc::Status probe_status;
  pb::ProbeResponse probe;
  // Why the sidecar would refuse the answer (a snapshot a Complete could
  // not store, or NUL in the detail); empty when it would not.
  std::string invalid;

  // "settle_succeeded", "settle_failed_retryable" or "leave_unknown".
  std::string Action() const {
    if (!probe_status.ok() || !invalid.empty()) return "leave_unknown";
    switch (probe.verdict()) {
      case pb::ProbeResponse::VERDICT_APPLIED:
        return probe.has_result() ? "settle_succeeded" : "leave_unknown";
      case pb::ProbeResponse::VERDICT_NOT_APPLIED:
        return "settle_failed_retryable";
      default:
        return "leave_unknown";
    }
  }

  // The verdict's short name, ERROR when the probe call failed, INVALID
  // when the sidecar would refuse the answer.
  std::string Verdict() const {
    if (!probe_status.ok()) return "ERROR";
    if (!invalid.empty()) return "INVALID";
    const std::string name = pb::ProbeResponse::Verdict_Name(probe.verdict());
    return name.empty() ? absl::StrCat("VERDICT_", probe.verdict()) : name;
  }

  // Why, for people: the snapshot for APPLIED, the error, or the detail.
  std::string Why() const {
    if (!probe_status.ok()) {
      return absl::StrCat("probe failed: ", CodeName(probe_status.error_code()),
                          ": ", probe_status.error_message(),
                          "; the loop tries again, then leaves it");
    }
    if (!invalid.empty()) {
      return absl::StrCat("the sidecar would refuse the answer: ", invalid,
                          "; the loop asks again, then leaves it");
    }
    std::string why;
    switch (probe.verdict()) {
      case pb::ProbeResponse::VERDICT_APPLIED:
        if (!probe.has_result()) {
          why = "APPLIED without a result snapshot: nothing to replay";
        } else {
          const pb::Snapshot& r = probe.result();
          std::string body = FormatBody(r.body());
          if (body.size() > 60) body = body.substr(0, 57) + "...";
          why = absl::StrCat(
              "code ", r.code(), ", ",
              r.content_type().empty() ? "no content type" : r.content_type(),
              ", ", r.body().size(), " bytes: ", body);
        }
        break;
      case pb::ProbeResponse::VERDICT_NOT_APPLIED:
      case pb::ProbeResponse::VERDICT_INDETERMINATE:
        break;
      default:
        why = "not a verdict the sidecar acts on";
        break;
    }
    if (!probe.detail().empty()) {
      why = why.empty() ? probe.detail()
                        : absl::StrCat(why, " (", probe.detail(), ")");
    }
    return why.empty() ? "-" : why;
  }
};

std::string ActionText(const std::string& action) {
  if (action == "settle_succeeded") return "settle SUCCEEDED";
  if (action == "settle_failed_retryable") return "settle FAILED retryable";
  return "leave UNKNOWN";
}

// Parses the JSON printed by ToJson (always valid) into a value.
nlohmann::json JsonOf(const google::protobuf::Message& message) {
  absl::StatusOr<std::string> text = ToJson(message);
  return text.ok() ? nlohmann::json::parse(*text) : nlohmann::json();
}

// A channel to the Reconciler at `address` made as the sidecar's reconcile
// loop makes it (server/core/probe_dial.h).
absl::StatusOr<std::shared_ptr<grpc::Channel>> ProbeChannel(
    const std::string& address, const ProbeTls& tls,
    size_t max_snapshot_bytes) {
  absl::StatusOr<ProbeDial> dial = PrepareProbeDial(tls, max_snapshot_bytes);
  if (!dial.ok()) return dial.status();
  return grpc::CreateCustomChannel(address, dial->credentials, dial->args);
}

// Sets p->invalid when the sidecar's reconciler would refuse p->probe:
// the same checks (server/wire/snapshot_validation.h) on the same parts.
void CheckAnswer(size_t max_snapshot_bytes, Preview* p) {
  const pb::ProbeResponse& r = p->probe;
  const bool applied = r.verdict() == pb::ProbeResponse::VERDICT_APPLIED;
  if (applied && !r.has_result()) return;
  if (!applied && r.verdict() != pb::ProbeResponse::VERDICT_NOT_APPLIED) {
    return;
  }
  absl::Status s;
  if (applied) s = CheckSnapshot(r.result(), "result", max_snapshot_bytes);
  if (s.ok()) {
    s = CheckText(ProbeReason(applied ? "applied" : "not_applied", r.detail()),
                  "detail (in the audit reason)", kMaxReasonBytes,
                  /*required=*/true);
  }
  if (!s.ok()) p->invalid = std::string(s.message());
}

int RunReconcile(const Globals& g, const ReconcileFlags& f) {
  if (!f.dry_run) {
    return UsageError(
        "reconcile only previews (--dry-run): the sidecars' reconcile loop "
        "applies verdicts for every operation with a `probe:` in their "
        "--config. Nothing was changed.");
  }
  if (f.probe.empty() && f.config.empty()) {
    return UsageError("reconcile needs --probe, --config or both");
  }
  // The sidecars' policies: each operation's probe address and probe_tls.
  PolicySet policies;
  if (!f.config.empty()) {
    absl::StatusOr<PolicySet> loaded = LoadPolicies(f.config);
    if (!loaded.ok()) {
      return UsageError(absl::StrCat("--config: ", loaded.status().message()));
    }
    policies = *std::move(loaded);
  }
  pb::ListRequest req;
  req.set_tenant(f.tenant);
  req.set_operation(f.operation);
  req.set_status(pb::STATUS_UNKNOWN);
  if (!f.older_than.empty()) {
    *req.mutable_older_than() =
        DurationToProto(*ParseCliDuration(f.older_than));
  }
  Client client(g);
  std::vector<Preview> previews;
  std::set<std::string> seen_tokens;
  while (true) {
    pb::ListResponse page;
    grpc::Status s = client.admin().List(client.Context().get(), req, &page);
    if (!s.ok()) return client.Error("reconcile: list", s);
    for (pb::Record& r : *page.mutable_records()) {
      previews.emplace_back();
      previews.back().record.Swap(&r);
    }
    if (page.next_page_token().empty()) break;
    if (!seen_tokens.insert(page.next_page_token()).second) {
      std::cerr << "idemctl: reconcile: the sidecar returned page token \""
                << page.next_page_token() << "\" twice; stopping\n";
      return kExitUnavailable;
    }
    req.set_page_token(page.next_page_token());
  }

  // The business services' Reconcilers, one channel per address and TLS
  // settings: plaintext unless --config gives the operation a probe_tls.
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels;
  const absl::Duration probe_timeout = *ParseCliDuration(f.probe_timeout);
  int failed_probes = 0;
  for (Preview& p : previews) {
    const Policy& policy = policies.For(p.record.key().operation());
    const std::string address = f.probe.empty() ? policy.probe : f.probe;
    const ProbeTls& tls = policy.probe_tls;
    std::shared_ptr<grpc::Channel>& channel =
        channels[absl::StrCat(address, "\n", tls.enabled, "\n", tls.ca, "\n",
                              tls.cert, "\n", tls.key, "\n", tls.server_name)];
    absl::Status made;
    if (address.empty()) {
      made = absl::FailedPreconditionError(
          "the operation has no probe in --config (the sidecar does not "
          "reconcile it)");
    } else if (channel == nullptr) {
      absl::StatusOr<std::shared_ptr<grpc::Channel>> c =
          ProbeChannel(address, tls, f.max_snapshot_bytes);
      made = c.status();
      if (c.ok()) channel = *std::move(c);
    }
    if (!made.ok()) {
      p.probe_status = grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                    std::string(made.message()));
      ++failed_probes;
      continue;
    }
    pb::ProbeRequest probe;
    *probe.mutable_key() = p.record.key();
    probe.set_request_hash(p.record.request_hash());
    probe.set_fencing_token(p.record.fencing_token());
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + probe_timeout));
    p.probe_status =
        pb::Reconciler::NewStub(channel)->Probe(&ctx, probe, &p.probe);
    if (p.probe_status.ok()) {
      CheckAnswer(f.max_snapshot_bytes, &p);
    } else {
      ++failed_probes;
    }
  }

  std::map<std::string, int> counts;
  for (const Preview& p : previews) ++counts[p.Action()];
  if (failed_probes > 0 && failed_probes == static_cast<int>(previews.size())) {
    std::cerr << "idemctl: reconcile: every probe call failed; is the "
                 "business service's idempotency.v1.Reconciler at "
              << (f.probe.empty() ? "the probe addresses of --config" : f.probe)
              << "? (plaintext gRPC unless --config gives a probe_tls)\n";
  }

  if (g.json) {
    nlohmann::json records = nlohmann::json::array();
    for (const Preview& p : previews) {
      nlohmann::json item = {
          {"key", JsonOf(p.record.key())},
          {"fencing_token", absl::StrCat(p.record.fencing_token())},
          {"updated_at", JsonOf(p.record.updated_at())},
          {"verdict", p.Verdict()},
          {"action", p.Action()},
          {"detail", p.probe.detail()},
          {"result", nullptr},
          {"error", nullptr},
          {"invalid", nullptr},
      };
      if (!p.probe_status.ok()) {
        item["error"] = {{"code", CodeName(p.probe_status.error_code())},
                         {"message", p.probe_status.error_message()}};
      } else if (p.probe.has_result()) {
        item["result"] = JsonOf(p.probe.result());
      }
      if (!p.invalid.empty()) item["invalid"] = p.invalid;
      records.push_back(std::move(item));
    }
    nlohmann::json doc = {
        {"dry_run", true},
        {"probe", f.probe},
        {"records", std::move(records)},
        {"summary",
         {{"settle_succeeded", counts["settle_succeeded"]},
          {"settle_failed_retryable", counts["settle_failed_retryable"]},
          {"leave_unknown", counts["leave_unknown"]}}},
    };
    std::cout << doc.dump() << "\n";
    return kExitOk;
  }

  if (previews.empty()) {
    std::cout << "no UNKNOWN records match\n";
    return kExitOk;
  }
  const absl::Time now = absl::Now();
  std::vector<std::vector<std::string>> rows = {{"TENANT", "OPERATION", "KEY",
                                                 "TOKEN", "AGE", "VERDICT",
                                                 "WOULD", "WHY"}};
  for (const Preview& p : previews) {
    const absl::Duration age =
        now - absl::FromUnixSeconds(p.record.updated_at().seconds());
    rows.push_back({p.record.key().tenant(), p.record.key().operation(),
                    p.record.key().key(),
                    absl::StrCat(p.record.fencing_token()),
                    absl::FormatDuration(absl::Trunc(
                        std::max(age, absl::ZeroDuration()), absl::Seconds(1))),
                    std::string(absl::StripPrefix(p.Verdict(), "VERDICT_")),
                    ActionText(p.Action()), p.Why()});
  }
  std::cout << FormatTable(rows) << previews.size()
            << (previews.size() == 1 ? " UNKNOWN record: "
                                     : " UNKNOWN records: ")
            << counts["settle_succeeded"] << " would settle SUCCEEDED, "
            << counts["settle_failed_retryable"] << " FAILED retryable, "
            << counts["leave_unknown"]
            << " stay UNKNOWN. Dry run: nothing was changed.\n";
  return kExitOk;
}

// Every page of the record's audit entries, in one table.
int RunHistory(const Globals& g, const KeyFlags& flags) {
  Client client(g);
  pb::HistoryRequest req;
  *req.mutable_key() = flags.Proto();
  req.set_page_size(1000);
  pb::HistoryResponse resp;
  std::set<std::string> seen_tokens;
  while (true) {
    pb::HistoryResponse page;
    grpc::Status s = client.admin().History(client.Context().get(), req, &page);
    if (!s.ok()) return client.Error("history", s);
    for (pb::AuditEntry& e : *page.mutable_entries()) {
      resp.add_entries()->Swap(&e);
    }
    if (page.next_page_token().empty()) break;
    if (!seen_tokens.insert(page.next_page_token()).second) {
      std::cerr << "idemctl: history: the sidecar returned page token \""
                << page.next_page_token() << "\" twice; stopping\n";
      return kExitUnavailable;
    }
    req.set_page_token(page.next_page_token());
  }
  if (g.json) return PrintJson(resp, kExitOk);
  if (resp.entries().empty()) {
    std::cout << "no audit entries for " << FormatKey(req.key()) << "\n";
  } else {
    std::cout << FormatHistory(resp);
  }
  return kExitOk;
}

std::string ServingName(HealthCheckResponse::ServingStatus status) {
  return HealthCheckResponse::ServingStatus_Name(status);
}

int RunHealth(const Globals& g) {
  static const char* const kServices[] = {"", "idempotency.v1.Idempotency",
                                          "idempotency.v1.IdempotencyAdmin",
                                          "liveness"};
  Client client(g);
  google::protobuf::Struct json;
  auto& fields = *json.mutable_fields();
  fields["addr"].set_string_value(g.addr);
  auto& services = *fields["services"].mutable_struct_value()->mutable_fields();
  std::vector<std::vector<std::string>> rows = {{"SERVICE", "STATUS"}};
  bool serving = true;
  for (const char* service : kServices) {
    HealthCheckRequest req;
    req.set_service(service);
    HealthCheckResponse resp;
    grpc::Status s = client.health().Check(client.Context().get(), req, &resp);
    if (s.error_code() == grpc::StatusCode::NOT_FOUND) {
      resp.set_status(HealthCheckResponse::SERVICE_UNKNOWN);
    } else if (!s.ok()) {
      return client.Error(absl::StrCat("health \"", service, "\""), s);
    }
    const std::string name = ServingName(resp.status());
    serving = serving && resp.status() == HealthCheckResponse::SERVING;
    const std::string label = *service == '\0' ? "(overall)" : service;
    services[service].set_string_value(name);
    rows.push_back({label, name});
  }
  fields["serving"].set_bool_value(serving);
  const int code = serving ? kExitOk : kExitRefused;
  if (g.json) return PrintJson(json, code);
  std::cout << "sidecar at " << g.addr << "\n" << FormatTable(rows);
  return code;
}

constexpr char kFooter[] =
    "A record is named by --tenant, --operation and --key.\n"
    "Exit codes: 0 ok; 1 not found or refused by the record's state; 2 usage\n"
    "error (bad flags, a field the sidecar rejects, missing confirmation);\n"
    "3 sidecar unavailable (unreachable, timed out, or any other error).\n"
    "Run 'idemctl COMMAND --help' for the flags of a command.";

int Main(int argc, char** argv) {
  CLI::App app{
      "Operator CLI for the idempotency sidecar: inspect records, list them, "
      "settle UNKNOWN ones, preview their reconciliation, read their audit "
      "trail, check health.",
      "idemctl"};
  app.footer(kFooter);
  app.require_subcommand(1);
  app.fallthrough();
  app.get_formatter()->column_width(34);

  Globals g;
  AddOption(&app, "addr", &g.addr, "Sidecar address HOST:PORT");
  app.add_flag("--json", g.json,
               "Print exactly one JSON document on stdout (proto field names)");
  app.add_option("--timeout", g.timeout,
                 "Deadline of each call, e.g. 500ms, 5s, 1m")
      ->check(CheckDuration, "DURATION")
      ->capture_default_str();
  AddFlag(&app, "tls", &g.tls,
          "Use TLS (implied by the other --tls-* flags); system roots "
          "unless --tls-ca");
  AddOption(&app, "tls-ca", &g.tls_ca, "PEM CA bundle to verify the sidecar");
  AddTlsKeyPairFlags(&app, "PEM client certificate chain (mutual TLS)",
                     &g.client_cert);
  AddOption(&app, "tls-server-name", &g.tls_server_name,
            "Expected name in the sidecar's certificate, if not the "
            "--addr host");
  AddOption(&app, "token-file", &g.token_file,
            "File holding a bearer token (or set IDEM_TOKEN)");

  KeyFlags get_flags;
  CLI::App* get = app.add_subcommand(
      "get", "Show one record (applying lease expiry if it is due)");
  AddKeyFlags(get, &get_flags);
  get->footer(
      "Example: idemctl get --tenant acme --operation create-payment --key "
      "order-42");

  ListFlags list_flags;
  CLI::App* list = app.add_subcommand(
      "list",
      "List records, oldest change first; one page unless --all. Filters "
      "combine.");
  list->add_option("--status", list_flags.status,
                   "Only this status: processing|succeeded|failed|unknown")
      ->check(CheckStatus, "STATUS");
  list->add_option("--older-than", list_flags.older_than,
                   "Only records last updated at least this long ago, e.g. "
                   "10m")
      ->check(CheckDuration, "DURATION");
  list->add_option("--tenant", list_flags.tenant,
                   "Only this tenant (default: every tenant)");
  list->add_option("--operation", list_flags.operation, "Only this operation");
  list->add_option("--page-size", list_flags.page_size,
                   "Records per page (default: the sidecar's, 100)")
      ->check(CLI::Range(1, 1000));
  CLI::Option* page_token =
      list->add_option("--page-token", list_flags.page_token,
                       "Continue where a previous page ended");
  list->add_flag("--all", list_flags.all,
                 "Follow next_page_token to the end and print every record")
      ->excludes(page_token);
  list->footer(
      "Example: idemctl list --status unknown --older-than 10m\n"
      "Without --all, one page is printed followed by the token of the next.");

  ResolveFlags rf;
  rf.actor = DefaultActor();
  CLI::App* resolve = app.add_subcommand(
      "resolve",
      "Settle an UNKNOWN record to SUCCEEDED or FAILED (audited). Shows the "
      "record and asks for confirmation unless --yes.");
  AddKeyFlags(resolve, &rf.key);
  resolve->add_option("--to", rf.to, "The new status: succeeded|failed")
      ->required()
      ->check(CheckResolveTarget, "succeeded|failed");
  resolve
      ->add_option("--reason", rf.reason,
                   "Why it is settled this way (required, audited)")
      ->required();
  CLI::Option* result_file =
      resolve->add_option("--result-file", rf.result_file,
                          "Snapshot body: the bytes of this file (content type "
                          "application/octet-stream unless --content-type)");
  CLI::Option* result_json = resolve->add_option(
      "--result-json", rf.result_json,
      "Snapshot body: this JSON text, content type application/json");
  result_json->excludes(result_file);
  CLI::Option* content_type = resolve->add_option(
      "--content-type", rf.content_type, "Content type of the snapshot");
  CLI::Option* code = resolve->add_option(
      "--code", rf.code,
      "Snapshot code, e.g. an HTTP status (default 200 for succeeded, 0 for "
      "failed)");
  resolve->add_flag("--retryable", rf.retryable,
                    "With --to failed: let the next Begin execute again");
  resolve->add_option("--actor", rf.actor, "Who resolves it (audited)")
      ->capture_default_str();
  resolve
      ->add_option("--expected-token", rf.expected_token,
                   "Refuse unless the record's fencing token is this one "
                   "(default: the token shown)")
      ->check(CLI::PositiveNumber);
  resolve->add_flag("--force", rf.force,
                    "Also resolve a PROCESSING record (its holder may still "
                    "be writing)");
  resolve->add_flag("--yes,-y", rf.yes,
                    "Do not ask for confirmation (needed when stdin is not a "
                    "terminal)");
  resolve->footer(
      "Every later Begin with the record's request hash replays the snapshot "
      "given here, byte for byte.\n"
      "Example: idemctl resolve --tenant acme --operation create-payment "
      "--key order-42 \\\n"
      "           --to succeeded --result-json '{\"payment_id\":\"p-1\"}' "
      "--code 201 --reason 'found in ledger'");

  ReconcileFlags cf;
  CLI::App* reconcile = app.add_subcommand(
      "reconcile",
      "Preview reconciliation: ask a business service's Reconciler.Probe "
      "about every UNKNOWN record that matches and show what the sidecars' "
      "reconcile loop would do. Needs --dry-run; changes nothing.");
  reconcile->add_option(
      "--probe", cf.probe,
      "The business service's idempotency.v1.Reconciler, HOST:PORT, for "
      "every record (default: each operation's probe in --config). "
      "Plaintext gRPC unless --config gives the operation a probe_tls; the "
      "--tls-* and token flags apply only to the sidecar");
  reconcile
      ->add_option("--config", cf.config,
                   "The sidecars' --config: each operation's probe address "
                   "and probe_tls, used as their reconcile loop uses them")
      ->check(CLI::ExistingFile);
  reconcile
      ->add_option("--max-snapshot-bytes", cf.max_snapshot_bytes,
                   "The sidecars' --max-snapshot-bytes: a larger APPLIED "
                   "result is shown INVALID, as they would refuse it")
      ->capture_default_str();
  reconcile->add_flag("--dry-run", cf.dry_run,
                      "Required: only show the verdicts and what the loop "
                      "would do");
  reconcile->add_option("--tenant", cf.tenant,
                        "Only this tenant (default: every tenant)");
  reconcile->add_option("--operation", cf.operation,
                        "Only this operation (the one --probe implements)");
  reconcile
      ->add_option("--older-than", cf.older_than,
                   "Only records last updated at least this long ago, e.g. "
                   "10m")
      ->check(CheckDuration, "DURATION");
  reconcile
      ->add_option("--probe-timeout", cf.probe_timeout,
                   "Deadline of each Probe call (the sidecar uses 2s)")
      ->check(CheckDuration, "DURATION")
      ->capture_default_str();
  reconcile->footer(
      "Verdicts: APPLIED -> settle SUCCEEDED with the returned snapshot; "
      "NOT_APPLIED -> settle FAILED retryable (the client's retry executes); "
      "INDETERMINATE, an error, or an answer the sidecar would refuse "
      "(INVALID: a result a Complete could not store, NUL in the detail) -> "
      "left UNKNOWN (asked again later, then left to an operator: idemctl "
      "resolve).\n"
      "Every listed record is probed at --probe, or at its operation's "
      "probe in --config: with --probe, filter with --operation to the "
      "operation that service implements.\n"
      "Example: idemctl reconcile --operation create-payment --probe "
      "10.0.0.7:50070 --dry-run");

  KeyFlags history_flags;
  CLI::App* history = app.add_subcommand(
      "history",
      "Show the audit trail of one record: every change not made by its "
      "holder (expiries, late reports, resolves), oldest first, every "
      "page of it");
  AddKeyFlags(history, &history_flags);

  CLI::App* health = app.add_subcommand(
      "health",
      "Check grpc.health.v1 for the sidecar overall and for "
      "idempotency.v1.Idempotency and idempotency.v1.IdempotencyAdmin; exit "
      "1 if any is not SERVING");

  for (CLI::App* cmd : {get, list, resolve, reconcile, history, health}) {
    cmd->fallthrough();
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? kExitOk : kExitUsage;
  }
  g.deadline = *ParseCliDuration(g.timeout);
  absl::Status credentials = PrepareCredentials(&g);
  if (!credentials.ok()) return UsageError(std::string(credentials.message()));
  rf.has_result_file = result_file->count() > 0;
  rf.has_result_json = result_json->count() > 0;
  rf.has_content_type = content_type->count() > 0;
  rf.has_code = code->count() > 0;

  if (get->parsed()) return RunGet(g, get_flags);
  if (list->parsed()) return RunList(g, list_flags);
  if (resolve->parsed()) return RunResolve(g, rf);
  if (reconcile->parsed()) return RunReconcile(g, cf);
  if (history->parsed()) return RunHistory(g, history_flags);
  if (health->parsed()) return RunHealth(g);
  return UsageError("no command given");
}

}  // namespace
}  // namespace idem::cli

int main(int argc, char** argv) {
  try {
    return idem::cli::Main(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "idemctl: " << e.what() << "\n";
    return idem::cli::kExitUnavailable;
  }
}
