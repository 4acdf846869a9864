#ifdef GRAPHTRAIN_HAVE_DNNL
#include "kernels/cpu/dnnl_common.h"

#include <array>
#include <cstdlib>
#include <new>

namespace graphtrain::cpu {

dnnl_engine_t dnnl_cpu_engine() {
  static dnnl_engine_t engine = [] {
    dnnl_engine_t e = nullptr;
    if (dnnl_engine_create(&e, dnnl_cpu, 0) != dnnl_success) e = nullptr;
    return e;
  }();
  return engine;
}

void* dnnl_workspace(size_t k, size_t bytes) {
  struct Buffer {
    void* data = nullptr;
    size_t bytes = 0;
    ~Buffer() { std::free(data); }
  };
  thread_local std::array<Buffer, 4> buffers;
  Buffer& b = buffers.at(k);
  if (b.bytes < bytes) {
    std::free(b.data);
    size_t rounded = (bytes + 63) / 64 * 64;
    b.data = std::aligned_alloc(64, rounded);
    b.bytes = b.data ? rounded : 0;
    if (!b.data) throw std::bad_alloc();
  }
  return b.data;
}

}  // namespace graphtrain::cpu
#endif
