// What the CPU kernels share: the thread fan-out over XLA's intra-op pool, and 16-lane float vectors.
#ifndef PORCH_JAX_KERNELS_CPU_COMMON_H_
#define PORCH_JAX_KERNELS_CPU_COMMON_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>

#include "xla/ffi/api/ffi.h"

namespace porch {

// Runs fn(item) for item in [0, items) on the caller and on XLA's intra-op pool.
//
// The caller waits only for helpers that have started. Under a mesh of several CPU devices, the pool's
// threads may all be running other devices' programs, blocked in a collective that waits for this device:
// a caller that waited for its scheduled helpers to run would never return (a deadlock XLA reports as a
// rendezvous timeout). So the caller drains the items itself; a helper that starts late finds none left and
// returns without touching fn, which is why the counters live in a shared block that outlives the call.
template <typename F>
void parallel_for(xla::ffi::ThreadPool& pool, int64_t items, F fn) {
  struct Shared {
    std::atomic<int64_t> next{0}, active{0};
  };
  const int64_t helpers = std::min<int64_t>(std::max<int64_t>(pool.num_threads(), 1), items) - 1;
  auto shared = std::make_shared<Shared>();
  F* work = &fn;
  auto drain = [items, work](Shared& s) {
    for (int64_t i = s.next.fetch_add(1); i < items; i = s.next.fetch_add(1)) (*work)(i);
  };
  for (int64_t h = 0; h < helpers; ++h) {
    pool.Schedule([shared, drain] {
      shared->active.fetch_add(1);  // before claiming: a caller that sees 0 after draining has no helper mid-item
      drain(*shared);
      shared->active.fetch_sub(1);
    });
  }
  drain(*shared);  // returns once every item is claimed; `next` never goes back below `items`
  while (shared->active.load() > 0) std::this_thread::yield();
}

typedef float f32x4 __attribute__((vector_size(16)));
typedef float f32x8 __attribute__((vector_size(32)));
typedef float f32x16 __attribute__((vector_size(64)));
typedef int i32x16 __attribute__((vector_size(64)));

}  // namespace porch

#endif  // PORCH_JAX_KERNELS_CPU_COMMON_H_
