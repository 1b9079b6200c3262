// A fixed set of worker threads running queued tasks: how the tuner and `flexjit tune` compile
// candidates in parallel (NVRTC is thread-safe, and the KernelBuilder compiles a key once).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

namespace flexjit::tune {

class ThreadPool {
 public:
  // `threads` workers (0: std::thread::hardware_concurrency(), at least 1).
  explicit ThreadPool(size_t threads = 0);
  // Runs what is queued, then joins the workers.
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  size_t size() const { return workers_.size(); }

  // Queues `task`; the future carries its exception, if any (a task never takes a worker down).
  std::future<void> submit(std::function<void()> task);

 private:
  void work();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::packaged_task<void()>> queue_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

// Runs fn(0) ... fn(n - 1) on `pool` and waits for all of them; the first exception (by index)
// is rethrown after every task finished. Tasks report their own failures where they must not
// stop the others.
void parallel_for(ThreadPool& pool, size_t n, const std::function<void(size_t)>& fn);

}  // namespace flexjit::tune
