#include "server/change_feed.h"

#include "absl/time/clock.h"

namespace idem {

ChangeFeed::Subscription::~Subscription() {
  SteadyMutexLock lock(&feed_->mu_);
  auto it = feed_->subscribers_.find(key_);
  it->second.erase(this);
  if (it->second.empty()) feed_->subscribers_.erase(it);
}

uint64_t ChangeFeed::Subscription::WaitUntil(SteadyTime deadline) {
  SteadyMutexLock lock(&feed_->mu_);
  fired_cv_.WaitUntil(&lock, deadline,
                      [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(feed_->mu_) {
                        return fired_ != 0;
                      });
  const uint64_t fired = fired_;
  fired_ = 0;
  return fired;
}

std::unique_ptr<ChangeFeed::Subscription> ChangeFeed::Subscribe(
    const RecordKey& key) {
  auto sub = std::unique_ptr<Subscription>(new Subscription(this, key));
  SteadyMutexLock lock(&mu_);
  subscribers_[key].insert(sub.get());
  return sub;
}

void ChangeFeed::Publish(const RecordKey& key) {
  SteadyMutexLock lock(&mu_);
  auto it = subscribers_.find(key);
  if (it == subscribers_.end()) return;
  const uint64_t event = NextEvent();
  for (Subscription* s : it->second) {
    s->fired_ = event;
    s->fired_cv_.SignalAll();
  }
}

void ChangeFeed::PublishAll() {
  SteadyMutexLock lock(&mu_);
  const uint64_t event = NextEvent();
  for (auto& [key, subs] : subscribers_) {
    for (Subscription* s : subs) {
      s->fired_ = event;
      s->fired_cv_.SignalAll();
    }
  }
}

}  // namespace idem
