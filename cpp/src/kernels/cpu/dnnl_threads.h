// Debian's oneDNN threads with OpenMP. graphtrain's pool owns the parallelism, so a oneDNN call
// (and the creation of a primitive, which picks its blocking for the threads it will have) runs
// on one OpenMP thread; the calling thread's setting is put back after (in a PyTorch process the
// OpenMP runtime is torch's, and this thread may be one torch runs ops on).
#pragma once

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

}  // namespace graphtrain::cpu
