// For tests of core's calls: one Begin's answers, awaited on the test's
// thread.
#ifndef IDEM_SERVER_CORE_ANSWER_TEST_UTIL_H_
#define IDEM_SERVER_CORE_ANSWER_TEST_UTIL_H_

#include <mutex>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "common/steady_wait.h"
#include "gtest/gtest.h"
#include "server/core/coordinator.h"

namespace idem {

// Thread-safe; must outlive the call it answers.
class BeginAnswer {
 public:
  // The completion to give the Begin; counts every answer, keeps the last.
  Coordinator::BeginFn Fn() {
    return [this](absl::StatusOr<BeginResult> r) {
      std::lock_guard<std::mutex> lock(mu_);
      ++answers_;
      result_ = std::move(r);
      done_.Notify();
    };
  }
  // The answer, or DEADLINE_EXCEEDED when none came within `timeout`.
  absl::StatusOr<BeginResult> Await(
      absl::Duration timeout = absl::Seconds(10)) {
    if (!done_.WaitForNotificationWithTimeout(timeout)) {
      return absl::DeadlineExceededError("no answer");
    }
    std::lock_guard<std::mutex> lock(mu_);
    return result_;
  }
  bool answered() { return done_.HasBeenNotified(); }
  int answers() {
    std::lock_guard<std::mutex> lock(mu_);
    return answers_;
  }

 private:
  std::mutex mu_;
  int answers_ = 0;
  absl::StatusOr<BeginResult> result_ = absl::UnknownError("none");
  SteadyNotification done_;
};

// Expects `answer` to come, once, as the replay of a record completed with
// `body`.
inline void ExpectCompletedOnce(BeginAnswer& answer, const std::string& body) {
  absl::StatusOr<BeginResult> r = answer.Await();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->outcome, Outcome::kCompleted);
  ASSERT_TRUE(r->record->result.has_value());
  EXPECT_EQ(r->record->result->body, body);
  EXPECT_EQ(answer.answers(), 1);
}

}  // namespace idem

#endif  // IDEM_SERVER_CORE_ANSWER_TEST_UTIL_H_
