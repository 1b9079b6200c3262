#include "cpu/ParallelFor.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace flexjit::cpu {

int resolve_threads(int requested) {
  if (requested > 0) return requested;
  const unsigned hw = std::thread::hardware_concurrency();
  return hw > 0 ? static_cast<int>(hw) : 1;
}

void parallel_for(int64_t n, int threads, const std::function<void(int64_t, int)>& fn) {
  if (n <= 0) return;
  const int64_t t = std::min<int64_t>(std::max(threads, 1), n);
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mu;
  auto worker = [&](int w) {
    for (;;) {
      const int64_t i = next.fetch_add(1);
      if (i >= n || failed.load()) return;
      try {
        fn(i, w);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mu);
        if (!error) error = std::current_exception();
        failed = true;
      }
    }
  };
  std::vector<std::thread> pool;
  for (int64_t k = 1; k < t; ++k)
    pool.emplace_back(worker, static_cast<int>(k));
  worker(0);
  for (auto& th : pool)
    th.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace flexjit::cpu
