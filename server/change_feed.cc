#include "server/change_feed.h"

namespace idem {

ChangeFeed::Subscription::~Subscription() {
  absl::MutexLock lock(&feed_->mu_);
  auto it = feed_->subscribers_.find(key_);
  it->second.erase(this);
  if (it->second.empty()) feed_->subscribers_.erase(it);
}

bool ChangeFeed::Subscription::WaitUntil(absl::Time deadline) {
  absl::MutexLock lock(&feed_->mu_);
  feed_->mu_.AwaitWithDeadline(absl::Condition(&fired_), deadline);
  const bool fired = fired_;
  fired_ = false;
  return fired;
}

std::unique_ptr<ChangeFeed::Subscription> ChangeFeed::Subscribe(
    const RecordKey& key) {
  auto sub = std::unique_ptr<Subscription>(new Subscription(this, key));
  absl::MutexLock lock(&mu_);
  subscribers_[key].insert(sub.get());
  return sub;
}

void ChangeFeed::Publish(const RecordKey& key) {
  absl::MutexLock lock(&mu_);
  auto it = subscribers_.find(key);
  if (it == subscribers_.end()) return;
  for (Subscription* s : it->second) s->fired_ = true;
}

void ChangeFeed::PublishAll() {
  absl::MutexLock lock(&mu_);
  for (auto& [key, subs] : subscribers_) {
    for (Subscription* s : subs) s->fired_ = true;
  }
}

}  // namespace idem
