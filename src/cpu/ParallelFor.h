// parallel_for: runs a loop of independent work items over a few std::threads started for the
// call and joined before it returns (no pool: a call of the CPU backend is milliseconds, the
// threads' start-up tens of microseconds). The CPU backend's only form of parallelism: items
// are (b, h, q tile) of an attention forward, (b, kv head) of a backward, or (b, h, q tile) of
// a block mask.
#pragma once

#include <cstdint>
#include <functional>

namespace flexjit::cpu {

// The threads to use for `requested` (0: std::thread::hardware_concurrency(), at least 1).
int resolve_threads(int requested);

// Calls fn(i, worker) for every i in [0, n), each exactly once, on up to `threads` threads (the
// calling thread and threads - 1 new ones); items are handed out dynamically. `worker` in
// [0, threads) names the thread running the item (for per-thread scratch). The first exception
// thrown by fn is rethrown here after all threads stop (remaining items are skipped).
void parallel_for(int64_t n, int threads, const std::function<void(int64_t, int)>& fn);

}  // namespace flexjit::cpu
