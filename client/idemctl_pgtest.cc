// End to end: the real idemctl and idem-quickstart binaries, run as
// subprocesses against one real sidecar over a throwaway PostgreSQL. Covers
// settling an UNKNOWN record (list, resolve, get, history, and the replay a
// later Begin gets), confirmation, exit codes (1 not found or refused, 2
// usage, 3 unavailable), paging, health and the quickstart walk-through.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "tests/sidecar_env.h"
#include "tests/testing/files.h"
#include "tests/testing/ports.h"

extern char** environ;

namespace idem::testing {
namespace {

using ::google::protobuf::util::JsonStringToMessage;
using ::google::protobuf::util::MessageDifferencer;

SidecarEnv* env = nullptr;
std::string* temp_dir = nullptr;

class Environment : public ::testing::Environment {
 public:
  void SetUp() override {
    absl::StatusOr<std::string> dir = MakeTempDir("idemctl_pgtest.");
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_ = *dir;
    temp_dir = &dir_;
    absl::StatusOr<std::unique_ptr<SidecarEnv>> e =
        SidecarEnv::Start(IDEM_SIDECAR_PATH, 1);
    ASSERT_TRUE(e.ok()) << e.status();
    env_ = *std::move(e);
    env = env_.get();
  }
  void TearDown() override {
    env = nullptr;
    env_.reset();
    temp_dir = nullptr;
    if (!dir_.empty()) RemoveTempDir(dir_);
  }

 private:
  std::string dir_;
  std::unique_ptr<SidecarEnv> env_;
};

const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new Environment());

// What a finished subprocess left behind.
struct RunResult {
  int code = -1;
  std::string out;
  std::string err;
  std::string command;

  std::string Describe() const {
    return absl::StrCat("$ ", command, "\nexit code ", code, "\n--- stdout\n",
                        out, "--- stderr\n", err);
  }
};

// Options of RunBinary.
struct RunIn {
  // Added to (or replacing in) the environment, "NAME=value".
  std::vector<std::string> env;
  // Opened as the child's stdin.
  std::string stdin_path = "/dev/null";
};

// Runs argv to completion (killed after a minute) with stdout and stderr
// captured separately; code is the exit code, 128 + signal, or -1 if it could
// not be started.
RunResult RunBinary(const std::vector<std::string>& argv,
                    const RunIn& in = {}) {
  static int counter = 0;
  RunResult r;
  r.command = absl::StrJoin(argv, " ");
  const std::string base = absl::StrCat(*temp_dir, "/run-", ++counter);
  const std::string out_path = base + ".out";
  const std::string err_path = base + ".err";

  std::map<std::string, std::string> vars;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    vars[kv.substr(0, kv.find('='))] = kv;
  }
  vars.erase("IDEM_ADDR");  // only what the test says
  for (const std::string& kv : in.env) vars[kv.substr(0, kv.find('='))] = kv;
  std::vector<std::string> env_strings;
  env_strings.reserve(vars.size());
  for (const auto& [name, kv] : vars) env_strings.push_back(kv);
  std::vector<char*> envp;
  envp.reserve(env_strings.size() + 1);
  for (std::string& kv : env_strings) envp.push_back(kv.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = argv;
  std::vector<char*> argvp;
  argvp.reserve(args.size() + 1);
  for (std::string& a : args) argvp.push_back(a.data());
  argvp.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, in.stdin_path.c_str(),
                                   O_RDONLY | O_NOCTTY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, out_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&actions, 2, err_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0600);
  pid_t pid = -1;
  const int rc =
      posix_spawn(&pid, argvp[0], &actions, nullptr, argvp.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    r.err = absl::StrCat("posix_spawn: ", std::strerror(rc));
    return r;
  }
  const absl::Time deadline = absl::Now() + absl::Minutes(1);
  int status = 0;
  while (true) {
    const pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (w < 0 && errno != EINTR) {
      r.err = absl::StrCat("waitpid: ", std::strerror(errno));
      return r;
    }
    if (absl::Now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      r.err = "killed after a minute\n";
      break;
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  if (WIFEXITED(status)) {
    r.code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    r.code = 128 + WTERMSIG(status);
  }
  r.out = ReadFile(out_path);
  r.err += ReadFile(err_path);
  return r;
}

// A pseudo-terminal whose slave side a child can use as stdin.
class Pty {
 public:
  Pty() {
    master_ = posix_openpt(O_RDWR | O_NOCTTY);
    if (master_ >= 0 && grantpt(master_) == 0 && unlockpt(master_) == 0) {
      const char* name = ptsname(master_);
      if (name != nullptr) slave_path_ = name;
    }
  }
  ~Pty() {
    if (master_ >= 0) close(master_);
  }
  bool ok() const { return !slave_path_.empty(); }
  const std::string& slave_path() const { return slave_path_; }
  // Types `text` on the terminal (it waits there until the child reads it).
  bool Type(const std::string& text) {
    return write(master_, text.data(), text.size()) ==
           static_cast<ssize_t>(text.size());
  }

 private:
  int master_ = -1;
  std::string slave_path_;
};

class IdemctlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(env, nullptr) << "environment did not start";
    tenant_ = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    addr_ = env->sidecar(0).Address();
  }

  // Runs idemctl --addr <the sidecar> args...
  RunResult Ctl(const std::vector<std::string>& args, const RunIn& in = {}) {
    std::vector<std::string> argv = {IDEMCTL_PATH, "--addr", addr_};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunBinary(argv, in);
  }

  // Returns `command` followed by the flags naming record `key`, then `more`.
  std::vector<std::string> Cmd(const std::string& command,
                               const std::string& key,
                               const std::vector<std::string>& more = {}) {
    std::vector<std::string> args = {
        command, "--tenant", tenant_, "--operation", kOperation, "--key", key};
    args.insert(args.end(), more.begin(), more.end());
    return args;
  }

  pb::RecordKey K(const std::string& key) {
    return Key(tenant_, kOperation, key);
  }

  pb::BeginResponse Begin(const std::string& key, const std::string& hash,
                          int lease_seconds = 0) {
    pb::BeginRequest req;
    *req.mutable_key() = K(key);
    req.set_request_hash(hash);
    if (lease_seconds > 0) req.mutable_lease()->set_seconds(lease_seconds);
    pb::BeginResponse resp;
    grpc::Status s = env->client(0).Begin(Ctx().get(), req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp;
  }

  pb::Record Get(const std::string& key) {
    pb::GetRequest req;
    *req.mutable_key() = K(key);
    pb::GetResponse resp;
    grpc::Status s = env->client(0).Get(Ctx().get(), req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.record();
  }

  pb::HistoryResponse History(const std::string& key) {
    pb::HistoryRequest req;
    *req.mutable_key() = K(key);
    pb::HistoryResponse resp;
    grpc::Status s = env->admin(0).History(Ctx().get(), req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp;
  }

  // Begins `key` with a 1 s lease, lets it run out, and applies the expiry
  // with a Get: the record is then UNKNOWN.
  void MakeUnknown(const std::string& key, const std::string& hash) {
    ASSERT_EQ(Begin(key, hash, 1).outcome(), pb::OUTCOME_ACQUIRED);
    absl::SleepFor(absl::Milliseconds(1300));
    ASSERT_EQ(Get(key).status(), pb::STATUS_UNKNOWN);
  }

  static constexpr char kOperation[] = "create-payment";
  std::string tenant_;
  std::string addr_;
};

template <typename M>
M ParseJson(const RunResult& r) {
  M m;
  const auto status = JsonStringToMessage(r.out, &m);
  EXPECT_TRUE(status.ok()) << status.ToString() << "\n" << r.Describe();
  return m;
}

TEST_F(IdemctlTest, UnknownRecordIsListedResolvedAndReplayed) {
  MakeUnknown("k", "hash-1");

  RunResult list =
      Ctl({"list", "--status", "unknown", "--tenant", tenant_, "--json"});
  ASSERT_EQ(list.code, 0) << list.Describe();
  auto listed = ParseJson<pb::ListResponse>(list);
  ASSERT_EQ(listed.records_size(), 1) << list.Describe();
  EXPECT_EQ(listed.records(0).key().key(), "k");
  EXPECT_EQ(listed.records(0).status(), pb::STATUS_UNKNOWN);
  EXPECT_TRUE(listed.next_page_token().empty());
  // Field names are the .proto ones.
  EXPECT_TRUE(absl::StrContains(list.out, "\"next_page_token\"")) << list.out;
  EXPECT_TRUE(absl::StrContains(list.out, "\"fencing_token\"")) << list.out;

  RunResult table = Ctl({"list", "--status", "UNKNOWN", "--tenant", tenant_});
  ASSERT_EQ(table.code, 0) << table.Describe();
  EXPECT_TRUE(absl::StrContains(table.out, "UNKNOWN")) << table.Describe();
  EXPECT_TRUE(absl::StrContains(table.out, tenant_)) << table.Describe();
  EXPECT_TRUE(absl::StrContains(table.out, "1 record\n")) << table.Describe();

  RunIn as_alice;
  as_alice.env = {"USER=alice-op"};
  RunResult resolved = Ctl(Cmd("resolve", "k",
                               {"--to", "succeeded", "--result-json",
                                R"({"ok":true})", "--reason", "r", "--yes"}),
                           as_alice);
  ASSERT_EQ(resolved.code, 0) << resolved.Describe();
  EXPECT_TRUE(absl::StrContains(resolved.out, "SUCCEEDED"))
      << resolved.Describe();

  RunResult get = Ctl(Cmd("get", "k"));
  ASSERT_EQ(get.code, 0) << get.Describe();
  for (const char* want :
       {"SUCCEEDED", R"({"ok":true})", "alice-op", "application/json"}) {
    EXPECT_TRUE(absl::StrContains(get.out, want)) << want << get.Describe();
  }

  RunResult get_json = Ctl(Cmd("get", "k", {"--json"}));
  ASSERT_EQ(get_json.code, 0) << get_json.Describe();
  const pb::Record record = ParseJson<pb::GetResponse>(get_json).record();
  EXPECT_EQ(record.status(), pb::STATUS_SUCCEEDED);
  EXPECT_EQ(record.resolved_by(), "alice-op");
  EXPECT_EQ(record.resolve_reason(), "r");
  pb::Snapshot want;
  want.set_code(200);
  want.set_body(R"({"ok":true})");
  want.set_content_type("application/json");
  EXPECT_TRUE(MessageDifferencer::Equals(record.result(), want))
      << record.result().DebugString();

  // Nothing is UNKNOWN any more.
  RunResult after =
      Ctl({"list", "--status", "unknown", "--tenant", tenant_, "--json"});
  ASSERT_EQ(after.code, 0) << after.Describe();
  EXPECT_EQ(ParseJson<pb::ListResponse>(after).records_size(), 0);

  // A retry of the business request replays exactly what the CLI was given.
  pb::BeginResponse replay = Begin("k", "hash-1");
  EXPECT_EQ(replay.outcome(), pb::OUTCOME_COMPLETED);
  EXPECT_TRUE(MessageDifferencer::Equals(replay.record().result(), want))
      << replay.record().result().DebugString();
  EXPECT_EQ(replay.record().result().body(), R"({"ok":true})");
  EXPECT_EQ(Begin("k", "hash-2").outcome(), pb::OUTCOME_MISMATCH);

  RunResult history = Ctl(Cmd("history", "k"));
  ASSERT_EQ(history.code, 0) << history.Describe();
  for (const char* want : {"PROCESSING", "UNKNOWN", "SUCCEEDED", "alice-op"}) {
    EXPECT_TRUE(absl::StrContains(history.out, want))
        << want << history.Describe();
  }
  RunResult history_json = Ctl(Cmd("history", "k", {"--json"}));
  ASSERT_EQ(history_json.code, 0) << history_json.Describe();
  auto entries = ParseJson<pb::HistoryResponse>(history_json);
  ASSERT_EQ(entries.entries_size(), 2) << history_json.Describe();
  EXPECT_EQ(entries.entries(0).from(), pb::STATUS_PROCESSING);
  EXPECT_EQ(entries.entries(0).to(), pb::STATUS_UNKNOWN);
  EXPECT_EQ(entries.entries(1).from(), pb::STATUS_UNKNOWN);
  EXPECT_EQ(entries.entries(1).to(), pb::STATUS_SUCCEEDED);
  EXPECT_EQ(entries.entries(1).actor(), "alice-op");
  EXPECT_EQ(entries.entries(1).reason(), "r");

  // Resolve is idempotent for the same content; other content is refused.
  RunResult again =
      Ctl(Cmd("resolve", "k",
              {"--to", "succeeded", "--result-json", R"({"ok":true})",
               "--reason", "r", "--yes", "--actor", "alice-op"}));
  EXPECT_EQ(again.code, 0) << again.Describe();
  RunResult other =
      Ctl(Cmd("resolve", "k",
              {"--to", "succeeded", "--result-json", R"({"ok":false})",
               "--reason", "r", "--yes", "--actor", "alice-op"}));
  EXPECT_EQ(other.code, 1) << other.Describe();
  EXPECT_TRUE(absl::StrContains(other.err, "FAILED_PRECONDITION"))
      << other.Describe();
  EXPECT_EQ(History("k").entries_size(), 2);
}

TEST_F(IdemctlTest, ResolveToFailedWithABinaryFileIsReplayedByteForByte) {
  MakeUnknown("bin", "hash-1");
  std::string bytes;
  for (int i = 0; i < 256; ++i) bytes.push_back(static_cast<char>(i));
  const std::string file = absl::StrCat(*temp_dir, "/", tenant_, ".bin");
  std::ofstream(file, std::ios::binary) << bytes;

  RunResult r =
      Ctl(Cmd("resolve", "bin",
              {"--to", "failed", "--result-file", file, "--content-type",
               "application/x-test", "--code", "502", "--reason",
               "declined upstream", "--yes", "--json"}));
  ASSERT_EQ(r.code, 0) << r.Describe();
  // Exactly one JSON document on stdout; the current record went to stderr.
  const auto resp = ParseJson<pb::ResolveResponse>(r);
  EXPECT_EQ(resp.record().status(), pb::STATUS_FAILED);
  EXPECT_FALSE(resp.record().retryable());
  EXPECT_TRUE(absl::StrContains(r.err, "UNKNOWN")) << r.Describe();

  pb::BeginResponse replay = Begin("bin", "hash-1");
  EXPECT_EQ(replay.outcome(), pb::OUTCOME_FAILED);
  EXPECT_EQ(replay.record().result().body(), bytes);
  EXPECT_EQ(replay.record().result().code(), 502);
  EXPECT_EQ(replay.record().result().content_type(), "application/x-test");

  RunResult get = Ctl(Cmd("get", "bin"));
  ASSERT_EQ(get.code, 0) << get.Describe();
  EXPECT_TRUE(absl::StrContains(get.out, "<256 bytes, base64: AAECAwQF"))
      << get.Describe();

  // A retryable failure lets the next Begin execute again.
  MakeUnknown("retry", "hash-1");
  RunResult retryable = Ctl(Cmd("resolve", "retry",
                                {"--to", "failed", "--retryable", "--code",
                                 "503", "--reason", "r", "--yes"}));
  ASSERT_EQ(retryable.code, 0) << retryable.Describe();
  pb::BeginResponse again = Begin("retry", "hash-1");
  EXPECT_EQ(again.outcome(), pb::OUTCOME_ACQUIRED);
  EXPECT_EQ(again.fencing_token(), 2);
}

TEST_F(IdemctlTest, MissingRecordExits1) {
  for (bool json : {false, true}) {
    std::vector<std::string> args = Cmd("get", "never");
    if (json) args.emplace_back("--json");
    RunResult r = Ctl(args);
    EXPECT_EQ(r.code, 1) << r.Describe();
    EXPECT_TRUE(r.out.empty()) << r.Describe();
    EXPECT_TRUE(absl::StrContains(r.err, "NOT_FOUND")) << r.Describe();
  }
  RunResult resolve = Ctl(
      Cmd("resolve", "never", {"--to", "failed", "--reason", "r", "--yes"}));
  EXPECT_EQ(resolve.code, 1) << resolve.Describe();
}

TEST_F(IdemctlTest, UnreachableSidecarExits3) {
  const std::string nowhere = absl::StrCat("127.0.0.1:", FreePort());
  const std::vector<std::vector<std::string>> commands = {
      Cmd("get", "k"),
      Cmd("get", "k", {"--json"}),
      {"list"},
      {"list", "--all", "--json"},
      Cmd("history", "k"),
      Cmd("resolve", "k",
          {"--to", "succeeded", "--result-json", "{}", "--reason", "r",
           "--yes"}),
      {"health"},
      {"health", "--json"},
  };
  for (const auto& args : commands) {
    std::vector<std::string> argv = {IDEMCTL_PATH, "--addr", nowhere,
                                     "--timeout", "3s"};
    argv.insert(argv.end(), args.begin(), args.end());
    RunResult r = RunBinary(argv);
    EXPECT_EQ(r.code, 3) << r.Describe();
    EXPECT_TRUE(r.out.empty()) << r.Describe();
    EXPECT_TRUE(absl::StrContains(r.err, "UNAVAILABLE") ||
                absl::StrContains(r.err, "DEADLINE_EXCEEDED"))
        << r.Describe();
  }
  RunResult quickstart = RunBinary({QUICKSTART_PATH, "--addr", nowhere});
  EXPECT_EQ(quickstart.code, 3) << quickstart.Describe();
}

TEST_F(IdemctlTest, UsageErrorsExit2AndWriteNothing) {
  MakeUnknown("k", "hash-1");
  const std::string missing_file = absl::StrCat(*temp_dir, "/no-such-file");
  auto resolve = [&](const std::vector<std::string>& more) {
    return Cmd("resolve", "k", more);
  };
  const std::vector<std::vector<std::string>> cases = {
      {},
      {"frobnicate"},
      {"get", "--tenant", tenant_, "--operation", "create-payment"},
      {"get", "--tenant", tenant_, "--operation", "create-payment", "--key",
       "k", "--bogus"},
      {"list", "--status", "done"},
      {"list", "--older-than", "soon"},
      {"list", "--page-size", "0"},
      {"--timeout", "forever", "health"},
      resolve({"--to", "unknown", "--reason", "r", "--yes"}),
      resolve({"--to", "succeeded", "--reason", "r", "--yes"}),
      resolve({"--to", "succeeded", "--result-json", "{}", "--yes"}),
      resolve({"--to", "succeeded", "--result-json", "not json", "--reason",
               "r", "--yes"}),
      resolve(
          {"--to", "succeeded", "--result-json", "", "--reason", "r", "--yes"}),
      resolve({"--to", "succeeded", "--result-json", "{}", "--result-file",
               "/dev/null", "--reason", "r", "--yes"}),
      resolve({"--to", "succeeded", "--result-json", "{}", "--retryable",
               "--reason", "r", "--yes"}),
      resolve({"--to", "succeeded", "--result-file", missing_file, "--reason",
               "r", "--yes"}),
      // Rejected by the sidecar: INVALID_ARGUMENT.
      {"get", "--tenant", "bad tenant", "--operation", "create-payment",
       "--key", "k"},
      resolve({"--to", "succeeded", "--result-json", "{}", "--reason",
               std::string(2000, 'r'), "--yes"}),
  };
  for (const auto& args : cases) {
    RunResult r = Ctl(args);
    EXPECT_EQ(r.code, 2) << r.Describe();
    EXPECT_FALSE(r.err.empty()) << r.Describe();
  }
  const pb::Record record = Get("k");
  EXPECT_EQ(record.status(), pb::STATUS_UNKNOWN);
  EXPECT_FALSE(record.has_result());
  EXPECT_EQ(History("k").entries_size(), 1);

  // --help works on every command.
  for (const char* command : {"get", "list", "resolve", "history", "health"}) {
    RunResult r = Ctl({command, "--help"});
    EXPECT_EQ(r.code, 0) << r.Describe();
    EXPECT_TRUE(absl::StrContains(r.out, "Usage:")) << r.Describe();
  }
  RunResult help = RunBinary({IDEMCTL_PATH, "--help"});
  EXPECT_EQ(help.code, 0) << help.Describe();
  EXPECT_TRUE(absl::StrContains(help.out, "resolve")) << help.Describe();
}

TEST_F(IdemctlTest, ResolveWithoutYesAndNoTerminalExits2AndChangesNothing) {
  MakeUnknown("k", "hash-1");
  RunResult r = Ctl(Cmd("resolve", "k",
                        {"--to", "succeeded", "--result-json", R"({"ok":true})",
                         "--reason", "r"}));
  EXPECT_EQ(r.code, 2) << r.Describe();
  EXPECT_TRUE(absl::StrContains(r.err, "--yes")) << r.Describe();
  const pb::Record record = Get("k");
  EXPECT_EQ(record.status(), pb::STATUS_UNKNOWN);
  EXPECT_FALSE(record.has_result());
  EXPECT_EQ(History("k").entries_size(), 1);
}

TEST_F(IdemctlTest, ResolveAsksOnATerminal) {
  MakeUnknown("k", "hash-1");
  const std::vector<std::string> args =
      Cmd("resolve", "k",
          {"--to", "succeeded", "--result-json", R"({"ok":true})", "--code",
           "201", "--reason", "r"});
  {
    Pty pty;
    if (!pty.ok()) GTEST_SKIP() << "no pseudo-terminal available";
    ASSERT_TRUE(pty.Type("n\n"));
    RunIn in;
    in.stdin_path = pty.slave_path();
    RunResult no = Ctl(args, in);
    EXPECT_EQ(no.code, 1) << no.Describe();
    EXPECT_TRUE(absl::StrContains(no.err, "to SUCCEEDED")) << no.Describe();
    EXPECT_TRUE(absl::StrContains(no.err, "[y/N]")) << no.Describe();
    EXPECT_EQ(Get("k").status(), pb::STATUS_UNKNOWN);
  }
  {
    Pty pty;
    if (!pty.ok()) GTEST_SKIP() << "no pseudo-terminal available";
    ASSERT_TRUE(pty.Type("yes\n"));
    RunIn in;
    in.stdin_path = pty.slave_path();
    RunResult yes = Ctl(args, in);
    EXPECT_EQ(yes.code, 0) << yes.Describe();
    const pb::Record record = Get("k");
    EXPECT_EQ(record.status(), pb::STATUS_SUCCEEDED);
    EXPECT_EQ(record.result().code(), 201);
  }
}

TEST_F(IdemctlTest, ProcessingRecordNeedsForce) {
  ASSERT_EQ(Begin("busy", "hash-1", 60).outcome(), pb::OUTCOME_ACQUIRED);
  const std::vector<std::string> args = Cmd(
      "resolve", "busy",
      {"--to", "failed", "--code", "500", "--reason", "holder died", "--yes"});
  RunResult refused = Ctl(args);
  EXPECT_EQ(refused.code, 1) << refused.Describe();
  EXPECT_EQ(Get("busy").status(), pb::STATUS_PROCESSING);
  // A wrong guard token is refused by the sidecar.
  std::vector<std::string> guarded = args;
  guarded.insert(guarded.end(), {"--force", "--expected-token", "7"});
  RunResult stale = Ctl(guarded);
  EXPECT_EQ(stale.code, 1) << stale.Describe();
  EXPECT_TRUE(absl::StrContains(stale.err, "FAILED_PRECONDITION"))
      << stale.Describe();
  std::vector<std::string> forced = args;
  forced.emplace_back("--force");
  RunResult ok = Ctl(forced);
  EXPECT_EQ(ok.code, 0) << ok.Describe();
  EXPECT_EQ(Get("busy").status(), pb::STATUS_FAILED);
}

TEST_F(IdemctlTest, ListFollowsPages) {
  for (int i = 0; i < 5; ++i) {
    ASSERT_EQ(Begin(absl::StrCat("page-", i), "hash-1").outcome(),
              pb::OUTCOME_ACQUIRED);
  }
  RunResult first =
      Ctl({"list", "--tenant", tenant_, "--page-size", "2", "--json"});
  ASSERT_EQ(first.code, 0) << first.Describe();
  const auto page1 = ParseJson<pb::ListResponse>(first);
  ASSERT_EQ(page1.records_size(), 2) << first.Describe();
  ASSERT_FALSE(page1.next_page_token().empty());

  RunResult second = Ctl({"list", "--tenant", tenant_, "--page-size", "2",
                          "--page-token", page1.next_page_token(), "--json"});
  ASSERT_EQ(second.code, 0) << second.Describe();
  const auto page2 = ParseJson<pb::ListResponse>(second);
  ASSERT_EQ(page2.records_size(), 2) << second.Describe();

  RunResult all =
      Ctl({"list", "--tenant", tenant_, "--operation", "create-payment",
           "--page-size", "2", "--all", "--json"});
  ASSERT_EQ(all.code, 0) << all.Describe();
  const auto everything = ParseJson<pb::ListResponse>(all);
  EXPECT_TRUE(everything.next_page_token().empty());
  std::set<std::string> keys;
  for (const pb::Record& r : everything.records()) keys.insert(r.key().key());
  EXPECT_EQ(keys.size(), 5u) << all.Describe();
  EXPECT_EQ(everything.records_size(), 5) << all.Describe();
  for (const pb::Record& r : page1.records()) {
    EXPECT_TRUE(keys.count(r.key().key()));
  }
  std::set<std::string> paged;
  for (const auto* p : {&page1, &page2}) {
    for (const pb::Record& r : p->records()) paged.insert(r.key().key());
  }
  EXPECT_EQ(paged.size(), 4u);

  RunResult human = Ctl({"list", "--tenant", tenant_, "--page-size", "2"});
  ASSERT_EQ(human.code, 0) << human.Describe();
  EXPECT_TRUE(absl::StrContains(human.out, "--page-token")) << human.Describe();
  RunResult human_all =
      Ctl({"list", "--tenant", tenant_, "--page-size", "2", "--all"});
  ASSERT_EQ(human_all.code, 0) << human_all.Describe();
  EXPECT_TRUE(absl::StrContains(human_all.out, "5 records\n"))
      << human_all.Describe();
  EXPECT_FALSE(absl::StrContains(human_all.out, "--page-token"))
      << human_all.Describe();

  // Filters that match nothing.
  RunResult old = Ctl({"list", "--tenant", tenant_, "--older-than", "1h"});
  ASSERT_EQ(old.code, 0) << old.Describe();
  EXPECT_TRUE(absl::StrContains(old.out, "no records")) << old.Describe();
  RunResult done =
      Ctl({"list", "--tenant", tenant_, "--status", "succeeded", "--json"});
  ASSERT_EQ(done.code, 0) << done.Describe();
  EXPECT_EQ(ParseJson<pb::ListResponse>(done).records_size(), 0);
}

// History answers at most 100 entries by default and 1000 at most, with a
// token for the rest bound to the record; idemctl history shows every page.
TEST_F(IdemctlTest, HistoryIsPagedAndIdemctlShowsEveryPage) {
  constexpr int kEntries = 1203;
  ASSERT_EQ(Begin("long", "hash-1").outcome(), pb::OUTCOME_ACQUIRED);
  env->Sql(absl::StrCat(
      "INSERT INTO idempotency_audit (tenant_id, operation, idempotency_key,"
      " from_status, to_status, actor, reason, fencing_token)"
      " SELECT '",
      tenant_, "', '", kOperation,
      "', 'long', 'PROCESSING', 'UNKNOWN', 'test', 'entry-' || i, i"
      " FROM generate_series(1, ",
      kEntries, ") AS i"));
  const auto history = [this](int page_size, const std::string& token,
                              pb::HistoryResponse* resp,
                              const std::string& key = "long") {
    pb::HistoryRequest req;
    *req.mutable_key() = K(key);
    req.set_page_size(page_size);
    req.set_page_token(token);
    return env->admin(0).History(Ctx().get(), req, resp);
  };
  pb::HistoryResponse first;
  ASSERT_TRUE(history(0, "", &first).ok());
  ASSERT_EQ(first.entries_size(), 100);
  EXPECT_EQ(first.entries(99).fencing_token(), 100);
  ASSERT_FALSE(first.next_page_token().empty());

  // Capped at 1000; the token goes on after the last entry answered.
  std::vector<int64_t> tokens;
  pb::HistoryResponse page;
  ASSERT_TRUE(history(5000, "", &page).ok());
  EXPECT_EQ(page.entries_size(), 1000);
  std::string token = page.next_page_token();
  for (const pb::AuditEntry& e : page.entries()) {
    tokens.push_back(e.fencing_token());
  }
  pb::HistoryResponse rest;
  ASSERT_TRUE(history(1000, token, &rest).ok());
  EXPECT_EQ(rest.entries_size(), kEntries - 1000);
  EXPECT_TRUE(rest.next_page_token().empty());
  for (const pb::AuditEntry& e : rest.entries()) {
    tokens.push_back(e.fencing_token());
  }
  ASSERT_EQ(tokens.size(), static_cast<size_t>(kEntries));
  for (int i = 0; i < kEntries; ++i) EXPECT_EQ(tokens[i], i + 1);

  // A token is for its record only; a page size is not negative.
  pb::HistoryResponse refused;
  grpc::Status s = history(0, token, &refused, "other");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message().rfind("page_token: ", 0), 0u)
      << s.error_message();
  s = history(0, "not a token", &refused);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  s = history(-1, "", &refused);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message().rfind("page_size: ", 0), 0u) << s.error_message();

  RunResult json = Ctl(Cmd("history", "long", {"--json"}));
  ASSERT_EQ(json.code, 0) << json.Describe();
  const auto all = ParseJson<pb::HistoryResponse>(json);
  ASSERT_EQ(all.entries_size(), kEntries);
  EXPECT_EQ(all.entries(0).reason(), "entry-1");
  EXPECT_EQ(all.entries(kEntries - 1).reason(), "entry-1203");
  EXPECT_TRUE(all.next_page_token().empty());
  RunResult human = Ctl(Cmd("history", "long"));
  ASSERT_EQ(human.code, 0) << human.Describe();
  EXPECT_TRUE(absl::StrContains(human.out, "entry-1203")) << human.err;
}

// What the sidecar promises of a List answer with more than one record
// (docs/spec.md#idemctl): under gRPC's default 4 MiB receive limit.
constexpr size_t kMaxListPageBytes = (4 << 20) - (64 << 10);

// Stores `key` of `tenant` SUCCEEDED through `stub` with a result of exactly
// `bytes` (body and content type, as --max-snapshot-bytes counts them).
void StoreLargeResult(pb::Idempotency::Stub& stub, const std::string& tenant,
                      const std::string& key, size_t bytes) {
  pb::BeginRequest begin;
  *begin.mutable_key() = Key(tenant, "create-payment", key);
  begin.set_request_hash("hash-1");
  pb::BeginResponse begun;
  grpc::Status s = stub.Begin(Ctx().get(), begin, &begun);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(begun.outcome(), pb::OUTCOME_ACQUIRED) << key;
  pb::CompleteRequest complete;
  *complete.mutable_key() = begin.key();
  complete.set_fencing_token(begun.fencing_token());
  pb::Snapshot* result = complete.mutable_result();
  result->set_code(200);
  result->set_content_type("application/octet-stream");
  result->set_body(std::string(bytes - result->content_type().size(),
                               static_cast<char>('a' + key.size() % 26)));
  pb::CompleteResponse completed;
  s = stub.Complete(Ctx().get(), complete, &completed);
  ASSERT_TRUE(s.ok()) << s.error_message();
}

// Pages through the records of `tenant` with plain gRPC; every page has
// a record and the keys are counted in `*seen`. Returns the pages.
std::vector<pb::ListResponse> ListAllPages(pb::IdempotencyAdmin::Stub& admin,
                                           const std::string& tenant,
                                           std::map<std::string, int>* seen) {
  std::vector<pb::ListResponse> pages;
  pb::ListRequest req;
  req.set_tenant(tenant);
  req.set_page_size(1000);
  do {
    pb::ListResponse page;
    grpc::Status s = admin.List(Ctx().get(), req, &page);
    EXPECT_TRUE(s.ok()) << "page " << pages.size() << ": " << s.error_code()
                        << " " << s.error_message();
    if (!s.ok()) break;
    EXPECT_GT(page.records_size(), 0) << "page " << pages.size();
    for (const pb::Record& r : page.records()) ++(*seen)[r.key().key()];
    req.set_page_token(page.next_page_token());
    pages.push_back(std::move(page));
  } while (!req.page_token().empty() && pages.size() < 100);
  return pages;
}

TEST_F(IdemctlTest, ListPagesOfLargeResultsStayUnderFourMebibytes) {
  // 40 results of the default largest, 256 KiB: 10 MiB in one answer would
  // be refused by every client keeping gRPC's default receive limit.
  constexpr int kRecords = 40;
  for (int i = 0; i < kRecords; ++i) {
    StoreLargeResult(env->client(0), tenant_, absl::StrCat("big-", i),
                     256 * 1024);
  }

  std::map<std::string, int> seen;
  const std::vector<pb::ListResponse> pages =
      ListAllPages(env->admin(0), tenant_, &seen);
  EXPECT_GE(pages.size(), 3u);
  for (const pb::ListResponse& page : pages) {
    EXPECT_LE(page.ByteSizeLong(), kMaxListPageBytes)
        << page.records_size() << " records";
    for (const pb::Record& r : page.records()) {
      EXPECT_EQ(r.result().body().size() + r.result().content_type().size(),
                256u * 1024);
    }
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(kRecords));
  for (const auto& [key, times] : seen) EXPECT_EQ(times, 1) << key;

  // idemctl reads the same pages, and lists each record once.
  RunResult all = Ctl(
      {"--json", "list", "--tenant", tenant_, "--page-size", "1000", "--all"});
  ASSERT_EQ(all.code, 0) << all.command << "\n" << all.err;
  const auto everything = ParseJson<pb::ListResponse>(all);
  EXPECT_EQ(everything.records_size(), kRecords);
  std::set<std::string> keys;
  for (const pb::Record& r : everything.records()) keys.insert(r.key().key());
  EXPECT_EQ(keys.size(), static_cast<size_t>(kRecords));

  // One page, and the way on.
  RunResult first = Ctl({"list", "--tenant", tenant_, "--page-size", "1000"});
  ASSERT_EQ(first.code, 0) << first.command << "\n" << first.err;
  EXPECT_TRUE(absl::StrContains(first.out, "--page-token")) << first.out;
}

TEST_F(IdemctlTest, ListReturnsARecordLargerThanAPageAlone) {
  // A sidecar that accepts results of 6 MiB: each record is a page alone.
  constexpr size_t kBig = 5 << 20;
  absl::StatusOr<std::unique_ptr<SidecarProcess>> big = SidecarProcess::Start(
      IDEM_SIDECAR_PATH, {"--postgres=" + env->pg().ConnInfo(),
                          absl::StrCat("--max-snapshot-bytes=", 6 << 20)});
  ASSERT_TRUE(big.ok()) << big.status();
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  auto channel = grpc::CreateCustomChannel(
      (*big)->Address(), grpc::InsecureChannelCredentials(), args);
  auto client = pb::Idempotency::NewStub(channel);
  auto admin = pb::IdempotencyAdmin::NewStub(channel);
  for (const char* key : {"huge-1", "huge-2", "huge-3"}) {
    StoreLargeResult(*client, tenant_, key, kBig);
  }

  std::map<std::string, int> seen;
  const std::vector<pb::ListResponse> pages =
      ListAllPages(*admin, tenant_, &seen);
  ASSERT_EQ(pages.size(), 3u);
  for (const pb::ListResponse& page : pages) {
    EXPECT_EQ(page.records_size(), 1);
  }
  EXPECT_EQ(seen.size(), 3u);
  for (const auto& [key, times] : seen) EXPECT_EQ(times, 1) << key;

  // idemctl reads answers past 4 MiB.
  RunResult all = RunBinary({IDEMCTL_PATH, "--addr", (*big)->Address(),
                             "--json", "list", "--tenant", tenant_, "--all"});
  ASSERT_EQ(all.code, 0) << all.command << "\n" << all.err;
  EXPECT_EQ(ParseJson<pb::ListResponse>(all).records_size(), 3);
  RunResult get =
      RunBinary({IDEMCTL_PATH, "--addr", (*big)->Address(), "get", "--tenant",
                 tenant_, "--operation", "create-payment", "--key", "huge-1"});
  EXPECT_EQ(get.code, 0) << get.command << "\n" << get.err;
}

TEST_F(IdemctlTest, HealthIsServing) {
  RunResult table = Ctl({"health"});
  ASSERT_EQ(table.code, 0) << table.Describe();
  EXPECT_TRUE(absl::StrContains(table.out, "idempotency.v1.IdempotencyAdmin"))
      << table.Describe();

  RunResult json = Ctl({"health", "--json"});
  ASSERT_EQ(json.code, 0) << json.Describe();
  const auto health = ParseJson<google::protobuf::Struct>(json);
  const auto& fields = health.fields();
  ASSERT_TRUE(fields.count("serving")) << json.Describe();
  EXPECT_TRUE(fields.at("serving").bool_value());
  EXPECT_EQ(fields.at("addr").string_value(), addr_);
  const auto& services = fields.at("services").struct_value().fields();
  EXPECT_EQ(services.size(), 4u) << json.Describe();
  for (const char* name : {"", "idempotency.v1.Idempotency",
                           "idempotency.v1.IdempotencyAdmin", "liveness"}) {
    ASSERT_TRUE(services.count(name)) << name << json.Describe();
    EXPECT_EQ(services.at(name).string_value(), "SERVING") << name;
  }

  // The address can come from IDEM_ADDR instead of --addr.
  RunIn in;
  in.env = {"IDEM_ADDR=" + addr_};
  RunResult from_env = RunBinary({IDEMCTL_PATH, "health"}, in);
  EXPECT_EQ(from_env.code, 0) << from_env.Describe();
}

TEST_F(IdemctlTest, QuickstartWalksThrough) {
  RunResult r = RunBinary({QUICKSTART_PATH, "--addr", addr_});
  EXPECT_EQ(r.code, 0) << r.Describe();
  EXPECT_TRUE(absl::StrContains(r.out, "4. ")) << r.Describe();
  EXPECT_TRUE(absl::StrContains(r.out, "MISMATCH")) << r.Describe();
  // It can run again: every run uses a fresh key.
  RunIn in;
  in.env = {"IDEM_ADDR=" + addr_};
  RunResult again = RunBinary({QUICKSTART_PATH}, in);
  EXPECT_EQ(again.code, 0) << again.Describe();
}

}  // namespace
}  // namespace idem::testing
