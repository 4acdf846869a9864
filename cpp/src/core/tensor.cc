#include "graphtrain/tensor.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <new>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "graphtrain/error.h"
#include "graphtrain/strings.h"

namespace graphtrain {
namespace {

std::atomic<int64_t> g_current{0};
std::atomic<int64_t> g_peak{0};

constexpr size_t kAlignment = 64;

void count_alloc(int64_t bytes) {
  int64_t now = g_current.fetch_add(bytes) + bytes;
  int64_t peak = g_peak.load();
  while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
  }
}

// Large blocks are cached: a freed block waits in a free list and serves the next request of
// about its size, so a training step, which allocates the same tensors every step, stops calling
// malloc (and stops page-faulting fresh memory) after its first step. Small blocks go to malloc,
// which caches them itself. The cache holds at most twice as many bytes as tensors ever held at
// once: a training step's stashed values and its gradients are freed at different times and do not
// fit each other's sizes, so a cache no larger than the peak dropped a block every step and the
// next step allocated it again (the mlp bench model's 4 MiB weight gradient), a malloc and free of
// megabytes a step that fragments the heap (RSS high-water mark +11 MiB over 40 steps).
// Under AddressSanitizer nothing is cached, so a use after free is still caught.
class BlockCache {
 public:
  static constexpr size_t kMinBytes = 64 << 10;

  static size_t round(size_t bytes) {
    size_t a = bytes < kMinBytes ? kAlignment : 4096;
    return std::max(kAlignment, (bytes + a - 1) / a * a);
  }

  // A cached block of at least `bytes` and at most 1.25x that, or nullptr; *size is its size.
  // Of the blocks of the smallest such size, the one freed last: the likeliest still in the
  // caches (a stashed activation or a gradient written into lines a step has just read; gpt's
  // training step at one thread, in-process A/B against the one freed first: GEMMs -0.07 to
  // -0.24 ms, the step -0.17 to -0.19 ms).
  void* take(size_t bytes, size_t* size) {
    if (!enabled(bytes)) return nullptr;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.lower_bound(bytes);
    if (it == free_.end() || it->first > bytes + bytes / 4) return nullptr;
    it = std::prev(free_.upper_bound(it->first));  // equal keys keep their insertion order
    *size = it->first;
    void* p = it->second;
    free_.erase(it);
    cached_ -= *size;
    return p;
  }

  // Keeps the block for later; false when the caller should free it.
  bool give(void* p, size_t size) {
    if (!enabled(size)) return false;
    std::lock_guard<std::mutex> lock(mu_);
    if (static_cast<int64_t>(cached_ + size) > 2 * g_peak.load()) return false;
    free_.emplace(size, p);
    cached_ += size;
    return true;
  }

  size_t cached_bytes() {
    std::lock_guard<std::mutex> lock(mu_);
    return cached_;
  }

  // Frees every cached block.
  void clear() {
    std::multimap<size_t, void*> blocks;
    {
      std::lock_guard<std::mutex> lock(mu_);
      blocks.swap(free_);
      cached_ = 0;
    }
    for (auto& [size, p] : blocks) std::free(p);
  }

  ~BlockCache() {
    for (auto& [size, p] : free_) std::free(p);
  }

 private:
  static bool enabled(size_t bytes) {
#if defined(__SANITIZE_ADDRESS__)
    (void)bytes;
    return false;
#else
    return bytes >= kMinBytes;
#endif
  }

  std::mutex mu_;
  std::multimap<size_t, void*> free_;
  size_t cached_ = 0;
};

BlockCache& block_cache() {
  static BlockCache* cache = new BlockCache();  // never destroyed: tensors may outlive statics
  return *cache;
}

}  // namespace

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_to_string(const Shape& shape) {
  return str_cat(shape);
}

MemoryStats memory_stats() {
  return {g_current.load(), g_peak.load(), static_cast<int64_t>(block_cache().cached_bytes())};
}
void release_cached_memory() {
  block_cache().clear();
#if defined(__GLIBC__)
  malloc_trim(0);  // and hands the freed pages back to the system
#endif
}

void reset_peak_memory() {
  g_peak.store(g_current.load());
}

std::shared_ptr<Storage> Storage::allocate(size_t bytes) {
  size_t rounded = BlockCache::round(bytes);
  void* p = block_cache().take(rounded, &rounded);
  if (p == nullptr) p = std::aligned_alloc(kAlignment, rounded);
  if (p == nullptr)
    throw Error(str_cat("out of memory: cannot allocate ", bytes, " bytes for a tensor"));
  count_alloc(static_cast<int64_t>(rounded));
  return std::shared_ptr<Storage>(new Storage(p, rounded, nullptr));
}

std::shared_ptr<Storage> Storage::borrow(void* data, size_t bytes, std::function<void()> release) {
  if (!release) release = [] {};
  return std::shared_ptr<Storage>(new Storage(data, bytes, std::move(release)));
}

Storage::~Storage() {
  if (release_) {
    release_();
  } else {
    g_current.fetch_sub(static_cast<int64_t>(bytes_));
    if (!block_cache().give(data_, bytes_)) std::free(data_);
  }
}

Tensor Tensor::empty(DType dtype, Shape shape) {
  for (int64_t d : shape)
    if (d < 0) throw Error("cannot create a tensor of shape " + shape_to_string(shape));
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.storage_ = Storage::allocate(t.nbytes());
  return t;
}

Tensor Tensor::on_storage(std::shared_ptr<Storage> storage, DType dtype, Shape shape) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  if (!storage || t.nbytes() > storage->bytes())
    throw Error(str_cat("a tensor of ", t.nbytes(), " bytes does not fit a storage of ",
                        storage ? storage->bytes() : 0, " bytes"));
  t.storage_ = std::move(storage);
  return t;
}

Tensor Tensor::zeros(DType dtype, Shape shape) {
  Tensor t = empty(dtype, std::move(shape));
  std::memset(t.raw_data(), 0, t.nbytes());
  return t;
}

Tensor Tensor::borrow(void* data, DType dtype, Shape shape, std::function<void()> release) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.storage_ = Storage::borrow(data, t.nbytes(), std::move(release));
  return t;
}

Tensor Tensor::scalar_int64(int64_t v) {
  Tensor t = empty(DType::kInt64, {});
  *t.data<int64_t>() = v;
  return t;
}

Tensor Tensor::view(Shape shape) const {
  if (shape_numel(shape) != numel())
    throw Error(str_cat("cannot view a tensor of shape ", shape_, " as shape ", shape));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::slice_view(int64_t begin_element, Shape shape) const {
  if (begin_element < 0 || begin_element + shape_numel(shape) > numel())
    throw Error(str_cat("slice of ", shape_numel(shape), " elements at ", begin_element,
                        " is outside a tensor of ", numel()));
  Tensor t = *this;
  t.offset_ += static_cast<size_t>(begin_element) * dtype_size(dtype_);
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::clone() const {
  Tensor t = empty(dtype_, shape_);
  if (nbytes()) std::memcpy(t.raw_data(), raw_data(), nbytes());
  return t;
}

double Tensor::as_double(int64_t i) const {
  switch (dtype_) {
    case DType::kFloat32:
      return data<float>()[i];
    case DType::kFloat64:
      return data<double>()[i];
    case DType::kFloat16:
      return half_to_float(data<uint16_t>()[i]);
    case DType::kBFloat16:
      return bfloat16_to_float(data<uint16_t>()[i]);
    case DType::kInt64:
      return static_cast<double>(data<int64_t>()[i]);
    case DType::kInt32:
      return data<int32_t>()[i];
    case DType::kInt8:
      return data<int8_t>()[i];
    case DType::kUInt8:
      return data<uint8_t>()[i];
    case DType::kBool:
      return data<bool>()[i] ? 1.0 : 0.0;
    case DType::kUndefined:
      break;
  }
  return 0;
}

std::vector<int64_t> Tensor::to_int64_vector() const {
  std::vector<int64_t> out(static_cast<size_t>(numel()));
  switch (dtype_) {
    case DType::kInt64:
      for (size_t i = 0; i < out.size(); ++i) out[i] = data<int64_t>()[i];
      break;
    case DType::kInt32:
      for (size_t i = 0; i < out.size(); ++i) out[i] = data<int32_t>()[i];
      break;
    default:
      throw Error(str_cat("expected an integer tensor, got ", describe()));
  }
  return out;
}

std::shared_ptr<Arena> Arena::create(size_t bytes) {
  return std::shared_ptr<Arena>(new Arena(Storage::allocate(bytes)));
}

Tensor Arena::place(size_t offset, DType dtype, Shape shape) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  if (offset % kAlignment != 0)
    throw Error(str_cat("arena offset ", offset, " is not a multiple of ", kAlignment));
  if (offset > bytes() || t.nbytes() > bytes() - offset)
    throw Error(str_cat("a tensor of ", t.nbytes(), " bytes at offset ", offset,
                        " does not fit an arena of ", bytes(), " bytes"));
  // The tensor's storage is a window of the arena's block that holds the arena alive.
  std::shared_ptr<Arena> self = shared_from_this();
  t.storage_ =
      Storage::borrow(static_cast<char*>(storage_->data()) + offset, t.nbytes(), [self] {});
  return t;
}

std::string Tensor::describe() const {
  return str_cat(to_string(dtype_), shape_);
}

}  // namespace graphtrain
