// What graphtrain's oneDNN kernels (matmul.cc, conv_dnnl.cc) share: the CPU engine, per-thread
// workspaces, and one OpenMP thread per call.
//
// Debian's oneDNN threads with OpenMP. graphtrain's pool owns the parallelism, so a oneDNN call
// (and the creation of a primitive, which picks its blocking for the threads it will have) runs
// on one OpenMP thread; the calling thread's setting is put back after (in a PyTorch process the
// OpenMP runtime is torch's, and this thread may be one torch runs ops on).
#pragma once

#include <oneapi/dnnl/dnnl.h>

#include <cstddef>

extern "C" int omp_get_max_threads();
extern "C" void omp_set_num_threads(int);

namespace graphtrain::cpu {

class OneOmpThread {
 public:
  OneOmpThread() : threads_(omp_get_max_threads()) {
    if (threads_ != 1) omp_set_num_threads(1);
  }
  ~OneOmpThread() {
    if (threads_ != 1) omp_set_num_threads(threads_);
  }
  OneOmpThread(const OneOmpThread&) = delete;
  OneOmpThread& operator=(const OneOmpThread&) = delete;

 private:
  int threads_;
};

// The process's oneDNN CPU engine (made on first use, never destroyed), or null where oneDNN
// cannot make one.
dnnl_engine_t dnnl_cpu_engine();

// This thread's buffer `k` (k < 4) of at least `bytes`, 64-byte aligned, grown as needed and kept
// for the thread's life: blocked copies and scratchpads run a few hundred KiB each, and a fresh
// allocation that size is a fresh mapping, page faults on every call. A buffer serves one oneDNN
// call (or one conv run) at a time.
void* dnnl_workspace(size_t k, size_t bytes);

}  // namespace graphtrain::cpu
