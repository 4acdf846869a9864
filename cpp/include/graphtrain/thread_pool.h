// graphtrain's thread pool owns all parallelism of the engine. The BLAS library is pinned to one
// thread; kernels split their work with parallel_for. A parallel_for issued from inside a pool
// task runs serially in that task (no nested oversubscription).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace graphtrain {

class ThreadPool {
 public:
  // The process-wide pool, sized by GRAPHTRAIN_NUM_THREADS (0: one thread per core). Creating it
  // pins the BLAS library to a single thread.
  static ThreadPool& global();

  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Calls fn(begin, end) over [0, n) in chunks of at least `grain` items, on up to num_threads()
  // threads (the caller is one of them). Returns when all chunks are done; rethrows the first
  // exception a chunk threw.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  struct Job;
  void worker_loop();
  static void run_chunks(Job& job);

  int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  Job* job_ = nullptr;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::mutex submit_mutex_;  // one parallel_for at a time from outside the pool
};

// Pins the BLAS library to one thread (called by ThreadPool::global()).
void pin_blas_to_one_thread();

}  // namespace graphtrain
