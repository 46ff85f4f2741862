// The order in which the parts start and stop: with parts that record it,
// and the list the sidecar's assembly builds (the memory store, in-process).
#include "server/main/assembly.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "server/main/parts.h"

namespace idem {
namespace {

using Names = std::vector<std::string>;

// Parts named `names` that append "start NAME" and "stop NAME" to *log;
// the one named `failing` fails to start.
Parts Recording(const std::vector<std::string>& names,
                std::vector<std::string>* log,
                const std::string& failing = "") {
  Parts parts;
  for (const std::string& name : names) {
    parts.Add(
        name,
        [name, log, failing]() -> absl::Status {
          log->push_back("start " + name);
          if (name == failing) return absl::UnavailableError("no " + name);
          return absl::OkStatus();
        },
        [name, log] { log->push_back("stop " + name); });
  }
  return parts;
}

TEST(PartsTest, StartInOrderAndStopInReverse) {
  std::vector<std::string> log;
  Parts parts = Recording({"a", "b", "c"}, &log);
  EXPECT_EQ(parts.Names(), Names({"a", "b", "c"}));
  ASSERT_TRUE(parts.Start().ok());
  parts.Stop();
  EXPECT_EQ(log, Names({"start a", "start b", "start c", "stop c", "stop b",
                        "stop a"}));
  // A second Stop finds nothing running.
  parts.Stop();
  EXPECT_EQ(log.size(), 6u);
}

TEST(PartsTest, AFailedStartStopsWhatStartedBeforeIt) {
  std::vector<std::string> log;
  Parts parts = Recording({"a", "b", "c", "d"}, &log, "c");
  absl::Status s = parts.Start();
  EXPECT_EQ(s, absl::UnavailableError("no c"));
  EXPECT_EQ(log, Names({"start a", "start b", "start c", "stop b", "stop a"}));
  parts.Stop();
  EXPECT_EQ(log.size(), 5u);
}

TEST(PartsTest, PartsWithNothingToDo) {
  Parts parts;
  parts.Add("idle", nullptr, nullptr);
  EXPECT_TRUE(parts.Start().ok());
  parts.Stop();
}

// A sidecar on the memory store, on a port of the kernel's choosing.
absl::StatusOr<std::unique_ptr<Sidecar>> MemorySidecar(bool metrics,
                                                       bool gateway) {
  SidecarConfig c;
  c.store = "memory";
  c.listen = "127.0.0.1:0";
  c.metrics_listen = metrics ? "127.0.0.1:0" : "off";
  c.grace_period = "5s";
  if (gateway) {
    c.http_listen = "127.0.0.1:0";
    c.http_upstream = "http://127.0.0.1:1";
  }
  absl::StatusOr<SidecarOptions> options = Validate(c);
  if (!options.ok()) return options.status();
  absl::StatusOr<SidecarResources> resources = LoadResources(&*options);
  if (!resources.ok()) return resources.status();
  return Sidecar::Build(*std::move(options), *std::move(resources));
}

// What starts first stops last: the health monitor reports SERVING only
// once everything else runs, and on SIGTERM its NOT_SERVING and the drain
// come before the servers stop; the background loops outlive the servers
// that may still settle calls in the grace period.
TEST(SidecarTest, PartsStartInThisOrder) {
  absl::StatusOr<std::unique_ptr<Sidecar>> full = MemorySidecar(true, true);
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_EQ((*full)->PartNames(), Names({"metrics", "maintenance", "reconciler",
                                         "grpc", "gateway", "serving"}));
  absl::StatusOr<std::unique_ptr<Sidecar>> bare = MemorySidecar(false, false);
  ASSERT_TRUE(bare.ok()) << bare.status();
  EXPECT_EQ((*bare)->PartNames(),
            Names({"maintenance", "reconciler", "grpc", "serving"}));
}

TEST(SidecarTest, StartsAndStops) {
  absl::StatusOr<std::unique_ptr<Sidecar>> sidecar = MemorySidecar(false, true);
  ASSERT_TRUE(sidecar.ok()) << sidecar.status();
  ASSERT_TRUE((*sidecar)->Start().ok());
  const absl::Time start = absl::Now();
  (*sidecar)->Stop();
  // Nothing in flight: the grace period is not waited out.
  EXPECT_LT(absl::Now() - start, absl::Seconds(4));
}

}  // namespace
}  // namespace idem
