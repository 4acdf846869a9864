#include "graphtrain/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <new>

#include <pthread.h>

#include "core/denormals.h"
#include "graphtrain/log.h"
#include "graphtrain/options.h"

extern "C" void openblas_set_num_threads(int num_threads);

namespace graphtrain {
namespace {

thread_local bool t_inside_pool = false;

// How long an idle worker spins for the next job while a graph runs before it sleeps.
constexpr auto kSpin = std::chrono::microseconds(1000);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Waits for `done()` by spinning, yielding the core now and then (the thread we wait for may need
// it when there are more threads than cores).
template <typename F>
void spin_until(F done) {
  for (int i = 0; !done(); ++i) {
    if ((i & 1023) == 1023)
      std::this_thread::yield();
    else
      cpu_relax();
  }
}

// The worker threads a child of fork() never had (forget_workers). Volatile: the store stays.
std::vector<std::thread>* volatile forgotten_workers = nullptr;

}  // namespace

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
  static const bool at_fork = [] {
    pthread_atfork(nullptr, nullptr, [] { ThreadPool::global().forget_workers(); });
    return true;
  }();
  (void)at_fork;
  return pool;
}

void ThreadPool::forget_workers() {
  // Only the forking thread lives on in a child of fork(): the workers' std::thread objects name
  // threads that are gone (joining or destroying them would hang or abort), and a lock one of
  // them held stays locked. Keep them, never joined, where a global points (so a leak checker
  // sees them referenced), and run every job on the calling thread, as with one thread.
  if (!workers_.empty()) forgotten_workers = new std::vector<std::thread>(std::move(workers_));
  workers_.clear();
  inside_.store(0);
  sleepers_.store(0);
  writing_.store(false);
  new (&mutex_) std::mutex;
  new (&submit_mutex_) std::mutex;
  new (&wake_) std::condition_variable;
}

ThreadPool::ThreadPool(int num_threads) : num_threads_(std::max(1, num_threads)) {
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_.store(true);
  }
  wake_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::run_chunks() {
  Job& job = job_;
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
    job.finished.fetch_add(1, std::memory_order_release);
  }
}

void ThreadPool::worker_loop() {
  t_inside_pool = true;
  uint64_t seen = 0;
  unsigned mode = float_mode();
  auto idle_since = std::chrono::steady_clock::now();
  for (;;) {
    // Announce first, then look: a submitter closes the door (writing_) and then waits for
    // inside_ == 0 before it rewrites job_. One that finds the door closed stays out: entering
    // after the submitter's last look at inside_, it would claim chunks of a half-written job.
    inside_.fetch_add(1);
    if (writing_.load()) {
      inside_.fetch_sub(1);
      cpu_relax();
      continue;
    }
    uint64_t g = generation_.load();
    if (g != seen) {
      seen = g;
      if (job_.float_mode != mode) set_float_mode(mode = job_.float_mode);
      run_chunks();
      inside_.fetch_sub(1);
      idle_since = std::chrono::steady_clock::now();
      continue;
    }
    inside_.fetch_sub(1);
    if (stop_.load()) return;
    if (busy_.load(std::memory_order_relaxed) > 0 &&
        std::chrono::steady_clock::now() - idle_since < kSpin) {
      for (int i = 0; i < 64; ++i) cpu_relax();
      continue;
    }
    std::unique_lock<std::mutex> lock(mutex_);
    sleepers_.fetch_add(1);
    wake_.wait(lock, [&] { return stop_.load() || generation_.load() != seen; });
    sleepers_.fetch_sub(1);
    idle_since = std::chrono::steady_clock::now();
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
  // Workers still leaving the previous job may read job_: close the door, then wait until none
  // is inside.
  writing_.store(true);
  spin_until([&] { return inside_.load() == 0; });
  Job& job = job_;
  job.fn = &fn;
  job.n = n;
  job.chunk = (n + max_chunks - 1) / max_chunks;
  job.num_chunks = (n + job.chunk - 1) / job.chunk;
  job.next.store(0);
  job.finished.store(0);
  job.error = nullptr;
  job.float_mode = float_mode();
  generation_.fetch_add(1);  // publishes the job
  writing_.store(false);
  if (sleepers_.load() > 0) {
    std::lock_guard<std::mutex> lock(mutex_);
    wake_.notify_all();
  }
  t_inside_pool = true;
  run_chunks();
  t_inside_pool = false;
  spin_until([&] { return job.finished.load(std::memory_order_acquire) >= job.num_chunks; });
  spin_until([&] { return inside_.load() == 0; });  // nobody reads job_ (or fn) after we return
  if (job.error) std::rethrow_exception(job.error);
}

}  // namespace graphtrain
