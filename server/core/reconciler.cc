#include "server/core/reconciler.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/await.h"
#include "common/thread_name.h"
#include "idempotency/v1/reconciler.grpc.pb.h"
#include "server/base/log.h"
#include "server/base/thread_names.h"
#include "server/core/probe_dial.h"
#include "server/wire/convert.h"
#include "server/wire/snapshot_validation.h"
#include "statemachine/transitions.h"

namespace idem {
namespace {

namespace pb = ::idempotency::v1;

LogFields Fields(const Record& r) {
  return {{"tenant", r.key.tenant},
          {"operation", r.key.operation},
          {"key", r.key.key},
          {"fencing_token", absl::StrCat(r.fencing_token)},
          {"actor", kActorReconciler}};
}

}  // namespace

Reconciler::Reconciler(MaintenanceStore* store, Coordinator* coordinator,
                       const PolicySet* policies, CoreMetrics* metrics,
                       ReconcilerOptions options)
    : store_(store),
      coordinator_(coordinator),
      policies_(policies),
      metrics_(metrics),
      options_(options) {
  for (const auto& [op, policy] : policies_->operations()) {
    if (!policy.probe.empty()) max_attempts_[op] = policy.reconcile_attempts;
  }
}

Reconciler::~Reconciler() {
  stop_.Notify();
  if (thread_.joinable()) thread_.join();
}

void Reconciler::Start() {
  if (max_attempts_.empty()) return;
  thread_ = std::thread([this] {
    NameThisThread(thread_names::kReconciler);
    while (!stop_.WaitForNotificationWithTimeout(options_.interval)) {
      absl::StatusOr<int> n = RunOnce();
      if (!n.ok()) {
        Log(LogLevel::kWarn, "reconcile pass failed",
            {{"error", std::string(n.status().message())}});
      }
    }
  });
}

absl::StatusOr<int> Reconciler::RunOnce() {
  if (max_attempts_.empty()) return 0;
  absl::StatusOr<std::vector<ReconcileClaim>> claims =
      store_->ClaimUnknown(max_attempts_, options_.interval,
                           options_.max_backoff, options_.batch_size);
  if (!claims.ok()) return claims.status();
  int settled = 0;
  for (const ReconcileClaim& claim : *claims) {
    if (Reconcile(claim, policies_->For(claim.record.key.operation))) {
      ++settled;
    }
  }
  return settled;
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> Reconciler::ChannelFor(
    const Policy& policy) {
  const ProbeTls& tls = policy.probe_tls;
  absl::StatusOr<ProbeDial> dial =
      PrepareProbeDial(tls, options_.max_snapshot_bytes);
  if (!dial.ok()) return dial.status();
  const std::string key =
      absl::StrCat(policy.probe, "\n", tls.enabled, "\n", tls.ca, "\n",
                   tls.cert, "\n", tls.key, "\n", tls.server_name);
  absl::MutexLock lock(&mu_);
  ProbeChannel& entry = channels_[key];
  if (entry.channel == nullptr || entry.pem != dial->pem) {
    entry.pem = std::move(dial->pem);
    entry.channel =
        grpc::CreateCustomChannel(policy.probe, dial->credentials, dial->args);
  }
  return entry.channel;
}

bool Reconciler::Reconcile(const ReconcileClaim& claim, const Policy& policy) {
  const Record& r = claim.record;
  pb::ProbeRequest req;
  pb::RecordKey* key = req.mutable_key();
  key->set_tenant(r.key.tenant);
  key->set_operation(r.key.operation);
  key->set_key(r.key.key);
  req.set_request_hash(r.request_hash);
  req.set_fencing_token(r.fencing_token);
  pb::ProbeResponse resp;
  grpc::Status s;
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = ChannelFor(policy);
  if (channel.ok()) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.probe_timeout));
    s = pb::Reconciler::NewStub(*channel)->Probe(&ctx, req, &resp);
  } else {
    s = grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                     std::string(channel.status().message()));
  }

  std::string verdict = "error";
  ResolveCommand cmd;
  cmd.actor = kActorReconciler;
  cmd.expected_fencing_token = r.fencing_token;
  // APPLIED without the result to replay cannot settle the record: every
  // retry would get an empty answer.
  if (s.ok() && resp.verdict() == pb::ProbeResponse::VERDICT_APPLIED &&
      !resp.has_result()) {
    resp.set_verdict(pb::ProbeResponse::VERDICT_INDETERMINATE);
    resp.set_detail("APPLIED without a result snapshot");
  }
  if (s.ok() && resp.verdict() == pb::ProbeResponse::VERDICT_APPLIED) {
    verdict = "applied";
    cmd.to = Status::kSucceeded;
    cmd.result = FromProto(resp.result());
  } else if (s.ok() &&
             resp.verdict() == pb::ProbeResponse::VERDICT_NOT_APPLIED) {
    verdict = "not_applied";
    cmd.to = Status::kFailed;
    cmd.retryable = true;
    Snapshot not_applied;
    not_applied.body = "NOT_APPLIED";
    not_applied.content_type = "text/plain";
    cmd.result = not_applied;
  } else if (s.ok()) {
    verdict = "indeterminate";
  }
  // What a Complete or a Resolve could not store is not stored from a probe
  // either: such an answer settles nothing.
  absl::Status invalid;
  if (verdict == "applied") {
    invalid =
        CheckSnapshot(resp.result(), "result", options_.max_snapshot_bytes);
  }
  if (invalid.ok() && (verdict == "applied" || verdict == "not_applied")) {
    // The probe's detail is cut to fit the stored reason's bound; a NUL in
    // it still refuses the answer.
    cmd.reason = ProbeReason(verdict, resp.detail());
    invalid = CheckText(cmd.reason, "detail (in the audit reason)",
                        kMaxReasonBytes, /*required=*/true);
  }
  if (!invalid.ok()) verdict = "invalid";
  if (metrics_ != nullptr) metrics_->Reconciled(verdict);
  LogFields fields = Fields(r);
  fields.emplace_back("verdict", verdict);
  fields.emplace_back("attempt", absl::StrCat(claim.attempt));
  if (verdict == "error" || verdict == "indeterminate" ||
      verdict == "invalid") {
    fields.emplace_back("detail", !invalid.ok() ? std::string(invalid.message())
                                  : s.ok()      ? resp.detail()
                                                : s.error_message());
    int64_t skipped = 0;
    if (verdict == "invalid" && invalid_log_.Due(&skipped)) {
      LogFields warn = fields;
      warn.emplace_back("invalid_not_logged", absl::StrCat(skipped));
      Log(LogLevel::kWarn,
          "reconcile probe answered what a Complete could not store; the "
          "record stays UNKNOWN",
          warn);
    }
    if (claim.attempt >= policy.reconcile_attempts) {
      if (metrics_ != nullptr) metrics_->ReconcileGivenUp();
      Log(LogLevel::kWarn,
          "reconciliation gave up: the UNKNOWN record is left to an operator",
          fields);
    } else {
      Log(LogLevel::kInfo, "reconcile probe undecided; trying again later",
          fields);
    }
    return false;
  }
  // The reconciler's own thread may wait.
  absl::StatusOr<Record> settled =
      Await<absl::StatusOr<Record>>([&](Coordinator::RecordFn done) {
        coordinator_->Resolve(r.key, cmd, std::move(done));
      });
  if (!settled.ok()) {
    // Settled meanwhile by someone else (another instance, an operator or
    // the holder's late report): nothing to do.
    fields.emplace_back("error", std::string(settled.status().message()));
    Log(LogLevel::kInfo, "reconcile verdict not applied", fields);
    return false;
  }
  if (metrics_ != nullptr) metrics_->Resolved(kActorReconciler);
  fields.emplace_back("status", StatusName(settled->status));
  Log(LogLevel::kInfo, "reconciled", fields);
  return true;
}

}  // namespace idem
