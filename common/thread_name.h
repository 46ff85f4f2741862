// Names the calling thread (as `top -H`, perf and /proc/<pid>/task/*/comm
// show it), so that a profile says which of the sidecar's threads burns the
// CPU. Linux keeps at most 15 bytes; longer names are cut. Null: no-op.
#ifndef IDEM_COMMON_THREAD_NAME_H_
#define IDEM_COMMON_THREAD_NAME_H_

#include <pthread.h>

#include <string>

namespace idem {

inline void NameThisThread(const char* name) {
  if (name == nullptr) return;
  pthread_setname_np(pthread_self(), std::string(name).substr(0, 15).c_str());
}

}  // namespace idem

#endif  // IDEM_COMMON_THREAD_NAME_H_
