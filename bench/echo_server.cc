// idem-bench-echo: a gRPC server with the sidecar's Begin RPC that answers
// every call at once with the same canned BeginResponse (a replay of a
// finished record with a --snapshot-bytes result). Driven by idem-bench
// (--scenario replay --no-preload), it gives the ceiling of any RPC on this
// machine: gRPC, protobuf and the loopback network, and nothing else. It is
// built like the sidecar (Begin on the completion-queue API with the
// sidecar's own server, server/rpc/async_server.h, and as many threads; the
// sidecar's synchronous health service; tcmalloc), so the sidecar's replay
// throughput divided by this one is the cost of the sidecar's own work.
//
// With --handoff it answers each call from one of two threads of its own
// instead, fed by the sidecar's batching queue (common/group_commit.h),
// and the answer goes back to the RPC thread to be sent (async_server.h): the
// way the sidecar answers a replay from PostgreSQL (its store's threads),
// with no I/O behind it. The gap between the two is what that hand-off
// costs.
//
//   idem-bench-echo --listen 127.0.0.1:0     # prints "listening on ADDR"
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>

#include <CLI/CLI.hpp>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "idempotency/v1/idempotency.grpc.pb.h"
#include "common/group_commit.h"
#include "server/rpc/async_server.h"
#include "server/rpc/health_service.h"

namespace idem::bench {
namespace {

namespace pb = ::idempotency::v1;

using BeginRpc = AsyncCall<pb::BeginRequest, pb::BeginResponse>;

// Answers Begin with a copy of one prepared response, on the thread that
// took the call (or, with `handoff`, on a thread of its own); every other
// RPC is UNIMPLEMENTED.
class EchoService final
    : public pb::Idempotency::WithAsyncMethod_Begin<pb::Idempotency::Service> {
 public:
  EchoService(size_t snapshot_bytes, bool handoff) {
    if (handoff) {
      // Two threads and batches of up to 64, as the sidecar's PostgreSQL
      // store threads.
      handoff_ = std::make_unique<BatchThreads<BeginRpc*>>(
          64, 2,
          [this](std::vector<BeginRpc*>& batch) {
            for (BeginRpc* call : batch) Answer(call);
          },
          "echo-handoff");
    }
    canned_.set_outcome(pb::OUTCOME_COMPLETED);
    pb::Record* r = canned_.mutable_record();
    r->mutable_key()->set_tenant("bench");
    r->mutable_key()->set_operation("bench-replay");
    r->mutable_key()->set_key("0");
    r->set_status(pb::STATUS_SUCCEEDED);
    r->set_request_hash(std::string(32, '\xab'));
    r->set_fencing_token(1);
    r->set_attempt(1);
    r->mutable_lease_expires_at()->set_seconds(1700000030);
    pb::Snapshot* result = r->mutable_result();
    result->set_code(200);
    result->set_body(std::string(snapshot_bytes, 'x'));
    result->set_content_type("application/octet-stream");
    r->mutable_created_at()->set_seconds(1700000000);
    r->mutable_updated_at()->set_seconds(1700000001);
    r->mutable_expires_at()->set_seconds(1700086401);
  }

  void ServeOn(AsyncServer* server) {
    server->Add(this, &EchoService::RequestBegin,
                [this](const std::vector<BeginRpc*>& calls) {
                  for (BeginRpc* call : calls) {
                    if (handoff_ != nullptr) {
                      handoff_->Submit(call);
                    } else {
                      Answer(call);
                    }
                  }
                },
                {/*ahead=*/64});
  }

 private:
  void Answer(BeginRpc* call) const {
    *call->response() = canned_;
    call->Finish(grpc::Status::OK);
  }

  pb::BeginResponse canned_;
  // Last: its threads stop before canned_ goes.
  std::unique_ptr<BatchThreads<BeginRpc*>> handoff_;
};

int Main(int argc, char** argv) {
  // SIGTERM and SIGINT are taken by sigwait below, not by a gRPC thread.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  std::string listen = "127.0.0.1:0";
  size_t snapshot_bytes = 256;
  CLI::App app{
      "idem-bench-echo: answers idempotency.v1.Idempotency/Begin with a "
      "canned response, as fast as gRPC allows."};
  app.add_option("--listen", listen, "address; port 0 picks a free one")
      ->capture_default_str();
  app.add_option("--snapshot-bytes", snapshot_bytes,
                 "result body size in the canned response")
      ->capture_default_str();
  bool handoff = false;
  app.add_flag("--handoff", handoff,
               "answer each call from a thread of its own, as the sidecar "
               "answers a replay from its Redis or PostgreSQL threads (the "
               "cost of that hand-off, with no I/O behind it)");
  CLI11_PARSE(app, argc, argv);

  EchoService service(snapshot_bytes, handoff);
  HealthService health;
  grpc::EnableDefaultHealthCheckService(false);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  builder.RegisterService(&health);
  AsyncServer rpcs(&builder, DefaultAsyncThreads());
  service.ServeOn(&rpcs);
  health.ServeOn(&rpcs);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::cerr << "idem-bench-echo: cannot listen on " << listen << "\n";
    return 2;
  }
  const std::string host = listen.substr(0, listen.rfind(':'));
  std::cout << "listening on " << host << ":" << port << std::endl;

  rpcs.Start();

  int sig = 0;
  sigwait(&signals, &sig);
  health.Shutdown();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  server->Wait();
  rpcs.Stop();
  return 0;
}

}  // namespace
}  // namespace idem::bench

int main(int argc, char** argv) {
  // As in the sidecar: Debian's Abseil has its deadlock detector on, which
  // costs every absl::Mutex (gRPC's too) more than the lock itself.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return idem::bench::Main(argc, argv);
}
