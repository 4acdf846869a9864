// graphtrain's thread pool owns all parallelism of the engine. The BLAS library is pinned to one
// thread; kernels split their work with parallel_for. A parallel_for issued from inside a pool
// task runs serially in that task (no nested oversubscription).
//
// Waking a sleeping thread costs tens of microseconds, more than many kernels take. So while a
// graph runs (a Busy scope is open), idle workers spin for the next parallel_for, for at most
// about a millisecond; outside runs they sleep at once, so the pool never spins between steps and
// never slows what runs next (PyTorch's own threads, another runtime).
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

  // In a child of fork(), called by an at-fork handler of the global pool: the pool runs every
  // parallel_for on the calling thread from then on.
  void forget_workers();

  // Calls fn(begin, end) over [0, n) in chunks of at least `grain` items, on up to num_threads()
  // threads (the caller is one of them). Returns when all chunks are done; rethrows the first
  // exception a chunk threw.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

  // While one is alive, idle workers spin (briefly) instead of sleeping: a graph run opens one.
  class Busy {
   public:
    explicit Busy(ThreadPool& pool) : pool_(pool) { pool_.busy_.fetch_add(1); }
    ~Busy() { pool_.busy_.fetch_sub(1); }
    Busy(const Busy&) = delete;
    Busy& operator=(const Busy&) = delete;

   private:
    ThreadPool& pool_;
  };

 private:
  struct Job {
    const std::function<void(int64_t, int64_t)>* fn = nullptr;
    int64_t n = 0, chunk = 0, num_chunks = 0;
    unsigned float_mode = 0;  // the submitter's (core/denormals.h): workers run the job in it
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> finished{0};
    std::exception_ptr error;
    std::mutex error_mutex;
  };
  void worker_loop();
  void run_chunks();

  int num_threads_;
  std::vector<std::thread> workers_;
  Job job_;                              // written only while no worker is inside it
  std::atomic<uint64_t> generation_{0};  // bumped when job_ holds a new job
  std::atomic<int> inside_{0};           // workers that may be reading job_
  std::atomic<bool> writing_{false};     // a submitter is rewriting job_: workers stay out
  std::atomic<int> sleepers_{0};
  std::atomic<int> busy_{0};
  std::atomic<bool> stop_{false};
  std::mutex mutex_;  // guards sleeping and waking
  std::condition_variable wake_;
  std::mutex submit_mutex_;  // one parallel_for at a time from outside the pool
};

// Pins the BLAS library to one thread (called by ThreadPool::global()).
void pin_blas_to_one_thread();

}  // namespace graphtrain
