// idem-bench-waiters: the three steps around a crowd of waiting Begins that
// bench/waiters.py drives, the waiters themselves being sent by h2load:
//
//   idem-bench-waiters hold --target ADDR --key K      # prints TOKEN n
//   idem-bench-waiters frame --key K --out FILE        # h2load's -d body
//   idem-bench-waiters complete --target ADDR --key K --fencing-token n
//                                                      # prints SENT_US t
//
// hold takes the key (ACQUIRED, a long lease); frame writes one gRPC
// message, a Begin on the same key and request hash that waits, as h2load
// sends it; complete finishes the key and prints when it sent Complete, in
// microseconds since the epoch, the clock of h2load's --log-file. With
// --linger, complete then waits for its standard input to close before it
// exits: a process's teardown (a few ms of CPU) would otherwise compete
// with the answers being measured.
#include <grpcpp/grpcpp.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "idempotency/v1/idempotency.grpc.pb.h"

namespace idem::bench {
namespace {

namespace pb = ::idempotency::v1;

struct Flags {
  std::string target = "127.0.0.1:50051";
  std::string tenant = "bench";
  std::string operation = "waiters";
  std::string key;
  std::string lease = "120s";
  std::string wait = "30s";
  std::string out;
  int64_t fencing_token = 0;
  bool linger = false;
};

int Fail(const std::string& message) {
  std::cerr << "idem-bench-waiters: " << message << "\n";
  return 2;
}

// Sets `*out` from `text`; "0" leaves it unset (a Begin that never waits).
bool ToProto(const std::string& flag, const std::string& text,
             google::protobuf::Duration* out) {
  absl::Duration d;
  if (!absl::ParseDuration(text, &d) || d < absl::ZeroDuration()) {
    std::cerr << "idem-bench-waiters: --" << flag << ": bad duration \"" << text
              << "\" (e.g. 30s)\n";
    return false;
  }
  if (d == absl::ZeroDuration()) return true;
  out->set_seconds(absl::ToInt64Seconds(d));
  out->set_nanos(static_cast<int32_t>(
      absl::ToInt64Nanoseconds(d - absl::Seconds(out->seconds()))));
  return true;
}

void SetKey(const Flags& f, pb::RecordKey* key) {
  key->set_tenant(f.tenant);
  key->set_operation(f.operation);
  key->set_key(f.key);
}

// Every Begin of the run carries this request hash (a SHA-256's 32
// bytes), so that the waiters match the holder.
const std::string& RequestHash() {
  static const std::string hash(32, '\x5a');
  return hash;
}

std::unique_ptr<pb::Idempotency::Stub> Stub(const std::string& target) {
  return pb::Idempotency::NewStub(
      grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
}

void SetDeadline(grpc::ClientContext* context) {
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::seconds(10));
}

int Hold(const Flags& f) {
  pb::BeginRequest req;
  SetKey(f, req.mutable_key());
  req.set_request_hash(RequestHash());
  if (!ToProto("lease", f.lease, req.mutable_lease())) return 2;
  pb::BeginResponse resp;
  grpc::ClientContext context;
  SetDeadline(&context);
  const grpc::Status s = Stub(f.target)->Begin(&context, req, &resp);
  if (!s.ok()) return Fail("Begin: " + s.error_message());
  if (resp.outcome() != pb::OUTCOME_ACQUIRED) {
    return Fail("Begin answered " + pb::Outcome_Name(resp.outcome()) +
                ", not ACQUIRED: use a new --key");
  }
  std::cout << "TOKEN " << resp.fencing_token() << std::endl;
  return 0;
}

int Frame(const Flags& f) {
  pb::BeginRequest req;
  SetKey(f, req.mutable_key());
  req.set_request_hash(RequestHash());
  google::protobuf::Duration wait;
  if (!ToProto("wait", f.wait, &wait)) return 2;
  if (wait.seconds() != 0 || wait.nanos() != 0) *req.mutable_wait() = wait;
  const std::string message = req.SerializeAsString();
  // The gRPC message prefix: not compressed, then the length, big-endian.
  std::string frame(1, '\0');
  for (int shift = 24; shift >= 0; shift -= 8) {
    frame.push_back(static_cast<char>((message.size() >> shift) & 0xff));
  }
  frame += message;
  std::ofstream out(f.out, std::ios::binary);
  out << frame;
  out.close();
  if (!out) return Fail("--out: cannot write " + f.out);
  return 0;
}

int Complete(const Flags& f) {
  pb::CompleteRequest req;
  SetKey(f, req.mutable_key());
  req.set_fencing_token(f.fencing_token);
  pb::Snapshot* result = req.mutable_result();
  result->set_code(201);
  result->set_content_type("application/octet-stream");
  result->set_body(std::string(256, 'r'));
  auto channel =
      grpc::CreateChannel(f.target, grpc::InsecureChannelCredentials());
  // Connect first, so that the time printed is the call's alone.
  if (!channel->WaitForConnected(std::chrono::system_clock::now() +
                                 std::chrono::seconds(10))) {
    return Fail("cannot connect to " + f.target);
  }
  auto stub = pb::Idempotency::NewStub(channel);
  // And call once (a Get of the key): a new channel's first call also
  // finishes HTTP/2's handshake, which a service's long-lived channel to its
  // sidecar has long done.
  {
    pb::GetRequest get;
    SetKey(f, get.mutable_key());
    pb::GetResponse got;
    grpc::ClientContext context;
    SetDeadline(&context);
    const grpc::Status s = stub->Get(&context, get, &got);
    if (!s.ok()) return Fail("Get: " + s.error_message());
  }
  pb::CompleteResponse resp;
  grpc::ClientContext context;
  SetDeadline(&context);
  const int64_t sent = absl::ToUnixMicros(absl::Now());
  const grpc::Status s = stub->Complete(&context, req, &resp);
  const int64_t answered = absl::ToUnixMicros(absl::Now());
  if (!s.ok()) return Fail("Complete: " + s.error_message());
  std::cout << "SENT_US " << sent << "\nANSWERED_US " << answered << std::endl;
  if (f.linger) {
    std::cin.ignore(std::numeric_limits<std::streamsize>::max());
  }
  return 0;
}

int Main(int argc, char** argv) {
  Flags f;
  CLI::App app{
      "idem-bench-waiters: hold a key, write h2load's waiting Begin, "
      "complete the key (bench/waiters.py)."};
  app.require_subcommand(1);
  auto common = [&f](CLI::App* cmd, bool remote) {
    if (remote) {
      cmd->add_option("--target", f.target, "host:port of a sidecar")
          ->capture_default_str();
    }
    cmd->add_option("--tenant", f.tenant)->capture_default_str();
    cmd->add_option("--operation", f.operation)->capture_default_str();
    cmd->add_option("--key", f.key)->required();
  };
  CLI::App* hold = app.add_subcommand("hold", "Begin the key; print TOKEN n");
  common(hold, true);
  hold->add_option("--lease", f.lease)->capture_default_str();
  CLI::App* frame =
      app.add_subcommand("frame", "write a waiting Begin as a gRPC message");
  common(frame, false);
  frame
      ->add_option("--wait", f.wait,
                   "how long the Begin may wait (0: it does not)")
      ->capture_default_str();
  frame->add_option("--out", f.out, "the file to write")->required();
  CLI::App* complete = app.add_subcommand(
      "complete", "Complete the key; print SENT_US and ANSWERED_US");
  common(complete, true);
  complete->add_option("--fencing-token", f.fencing_token)->required();
  complete->add_flag("--linger", f.linger,
                     "after printing, exit only once standard input closes");
  CLI11_PARSE(app, argc, argv);
  if (*hold) return Hold(f);
  if (*frame) return Frame(f);
  return Complete(f);
}

}  // namespace
}  // namespace idem::bench

int main(int argc, char** argv) { return idem::bench::Main(argc, argv); }
