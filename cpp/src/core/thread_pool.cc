#include "graphtrain/thread_pool.h"

#include <algorithm>
#include <exception>

#include "graphtrain/log.h"
#include "graphtrain/options.h"

extern "C" void openblas_set_num_threads(int num_threads);

namespace graphtrain {
namespace {
thread_local bool t_inside_pool = false;
}

struct ThreadPool::Job {
  const std::function<void(int64_t, int64_t)>* fn;
  int64_t n;
  int64_t chunk;
  int64_t num_chunks;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> finished{0};
  int workers_inside = 0;  // guarded by the pool's mutex: the job outlives every worker using it
  std::exception_ptr error;
  std::mutex error_mutex;
};

void pin_blas_to_one_thread() {
  openblas_set_num_threads(1);
}

ThreadPool& ThreadPool::global() {
  static ThreadPool pool([] {
    pin_blas_to_one_thread();
    int64_t n = Options::global().get_int("num_threads");
    if (n <= 0) n = std::max(1u, std::thread::hardware_concurrency());
    GT_DEVINFO("thread pool: ", n, " thread(s); BLAS pinned to one thread");
    return static_cast<int>(n);
  }());
  return pool;
}

ThreadPool::ThreadPool(int num_threads) : num_threads_(std::max(1, num_threads)) {
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::run_chunks(Job& job) {
  for (;;) {
    int64_t c = job.next.fetch_add(1);
    if (c >= job.num_chunks) break;
    int64_t begin = c * job.chunk;
    int64_t end = std::min(job.n, begin + job.chunk);
    try {
      (*job.fn)(begin, end);
    } catch (...) {
      std::lock_guard<std::mutex> lock(job.error_mutex);
      if (!job.error) job.error = std::current_exception();
    }
    job.finished.fetch_add(1);
  }
}

void ThreadPool::worker_loop() {
  t_inside_pool = true;
  uint64_t seen = 0;
  for (;;) {
    Job* job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || (job_ && generation_ != seen); });
      if (stop_) return;
      seen = generation_;
      job = job_;
      ++job->workers_inside;
    }
    run_chunks(*job);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      --job->workers_inside;
    }
    done_.notify_all();
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  int64_t max_chunks = std::min<int64_t>(num_threads_, (n + grain - 1) / grain);
  if (max_chunks <= 1 || t_inside_pool || workers_.empty()) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> submit(submit_mutex_);
  Job job;
  job.fn = &fn;
  job.n = n;
  job.chunk = (n + max_chunks - 1) / max_chunks;
  job.num_chunks = (n + job.chunk - 1) / job.chunk;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = &job;
    ++generation_;
  }
  wake_.notify_all();
  t_inside_pool = true;
  run_chunks(job);
  t_inside_pool = false;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock,
               [&] { return job.finished.load() >= job.num_chunks && job.workers_inside == 0; });
    job_ = nullptr;
  }
  if (job.error) std::rethrow_exception(job.error);
}

}  // namespace graphtrain
