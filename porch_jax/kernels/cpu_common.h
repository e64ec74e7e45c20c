// What the CPU kernels share: the thread fan-out over XLA's intra-op pool, and 16-lane float vectors.
#ifndef PORCH_JAX_KERNELS_CPU_COMMON_H_
#define PORCH_JAX_KERNELS_CPU_COMMON_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>

#include "xla/ffi/api/ffi.h"

namespace porch {

// Runs fn(item) for item in [0, items) on the caller and on XLA's intra-op pool.
template <typename F>
void parallel_for(xla::ffi::ThreadPool& pool, int64_t items, F fn) {
  const int64_t workers = std::min<int64_t>(std::max<int64_t>(pool.num_threads(), 1), items) - 1;
  std::atomic<int64_t> next{0}, done{0};
  auto drain = [&] {
    for (int64_t i = next.fetch_add(1); i < items; i = next.fetch_add(1)) fn(i);
  };
  for (int64_t w = 0; w < workers; ++w) pool.Schedule([&] { drain(); done.fetch_add(1); });
  drain();
  while (done.load() < workers) std::this_thread::yield();
}

typedef float f32x4 __attribute__((vector_size(16)));
typedef float f32x8 __attribute__((vector_size(32)));
typedef float f32x16 __attribute__((vector_size(64)));
typedef int i32x16 __attribute__((vector_size(64)));

}  // namespace porch

#endif  // PORCH_JAX_KERNELS_CPU_COMMON_H_
