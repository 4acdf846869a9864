// Denormal floats (magnitudes below 1.2e-38) make Intel CPUs' float arithmetic 10-100x slower
// (a microcode assist per operation); training never needs them. While a FlushDenormals scope is
// open, the calling thread flushes them to zero (x86 MXCSR: FTZ for results, DAZ for inputs), as
// TensorFlow's and oneDNN-based runtimes do; the thread's own mode comes back when it closes. The
// thread pool's workers take the mode of the thread that submits each job.
#pragma once

namespace graphtrain {

// The calling thread's floating-point control bits (x86 MXCSR without its exception flags; 0 on
// other CPUs).
unsigned float_mode();
void set_float_mode(unsigned mode);

class FlushDenormals {
 public:
  FlushDenormals();  // on where GRAPHTRAIN_FLUSH_DENORMALS is (the default)
  explicit FlushDenormals(bool on);
  ~FlushDenormals();
  FlushDenormals(const FlushDenormals&) = delete;
  FlushDenormals& operator=(const FlushDenormals&) = delete;

 private:
  unsigned saved_;
  bool changed_ = false;
};

}  // namespace graphtrain
