// Runs independent test jobs (NVRTC compiles, mostly) on a few threads.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <functional>
#include <thread>
#include <vector>

namespace flexjit::test {

// Calls job(i) for every i in [0, n) on up to `max_threads` threads (at least one, at most the
// hardware's); returns when all are done. job must be safe to call concurrently.
inline void run_parallel(size_t n, const std::function<void(size_t)>& job,
                         unsigned max_threads = 4) {
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i; (i = next++) < n;)
      job(i);
  };
  std::vector<std::thread> pool;
  const unsigned threads = std::max(1u, std::min(max_threads, std::thread::hardware_concurrency()));
  for (unsigned t = 0; t < threads; ++t)
    pool.emplace_back(worker);
  for (std::thread& t : pool)
    t.join();
}

}  // namespace flexjit::test
