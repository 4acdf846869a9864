// Tensors: contiguous, row-major, sharing reference-counted storage so reshape-like ops are views.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "graphtrain/dtype.h"

namespace graphtrain {

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& shape);
std::string shape_to_string(const Shape& shape);

// A block of memory: owned (64-byte aligned, counted by the allocator) or borrowed from outside
// (a DLPack tensor from torch or numpy) with a release function.
class Storage {
 public:
  static std::shared_ptr<Storage> allocate(size_t bytes);
  static std::shared_ptr<Storage> borrow(void* data, size_t bytes, std::function<void()> release);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  bool owned() const { return !release_; }

 private:
  Storage(void* data, size_t bytes, std::function<void()> release)
      : data_(data), bytes_(bytes), release_(std::move(release)) {}
  void* data_;
  size_t bytes_;
  std::function<void()> release_;  // empty: owned memory, freed through the allocator
};

// Bytes currently held by tensors and the peak since the last reset, for owned storage; and the
// bytes of freed large blocks kept for reuse (tensor.cc's block cache).
struct MemoryStats {
  int64_t current_bytes;
  int64_t peak_bytes;
  int64_t cached_bytes;
};
MemoryStats memory_stats();
void reset_peak_memory();
// Frees the cached blocks and returns free memory to the system: called when a plan's arena is
// made, since the blocks the recording run freed would otherwise sit beside it unused.
void release_cached_memory();

class Tensor;

// One block of memory that tensors are placed into at planned offsets (64-byte aligned); each
// tensor keeps the block alive. The memory planner lays out a plan's intermediates in an arena.
class Arena : public std::enable_shared_from_this<Arena> {
 public:
  static std::shared_ptr<Arena> create(size_t bytes);
  size_t bytes() const { return storage_->bytes(); }
  // A tensor at `offset` bytes; throws when it does not fit or the offset is misaligned.
  Tensor place(size_t offset, DType dtype, Shape shape);

 private:
  explicit Arena(std::shared_ptr<Storage> storage) : storage_(std::move(storage)) {}
  std::shared_ptr<Storage> storage_;
};

class Tensor {
 public:
  Tensor() = default;
  // Uninitialized memory of the given type and shape.
  static Tensor empty(DType dtype, Shape shape);
  static Tensor zeros(DType dtype, Shape shape);
  // Wraps memory owned elsewhere; `release` runs when the last tensor using it goes.
  static Tensor borrow(void* data, DType dtype, Shape shape, std::function<void()> release);
  // A tensor over an existing storage, from its start (another tensor's, taken over in place);
  // throws when the storage is too small.
  static Tensor on_storage(std::shared_ptr<Storage> storage, DType dtype, Shape shape);
  template <typename T>
  static Tensor from_vector(DType dtype, Shape shape, const std::vector<T>& values);
  static Tensor scalar_int64(int64_t v);

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t dim(size_t i) const { return shape_[i]; }
  size_t rank() const { return shape_.size(); }
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }

  void* raw_data() const { return static_cast<char*>(storage_->data()) + offset_; }
  template <typename T>
  T* data() const {
    return static_cast<T*>(raw_data());
  }
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  // A view with another shape of the same element count (no copy).
  Tensor view(Shape shape) const;
  // A view of elements [begin, begin + count) along the flattened tensor, with the given shape.
  Tensor slice_view(int64_t begin_element, Shape shape) const;
  Tensor clone() const;
  // Element i (of the flattened tensor) of any element type, as a double.
  double as_double(int64_t i) const;
  // Values as int64 (for shape-like inputs of any integer type); throws for other types.
  std::vector<int64_t> to_int64_vector() const;

  std::string describe() const;  // "float32[2, 3]"

 private:
  friend class Arena;
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;  // bytes
  DType dtype_ = DType::kUndefined;
  Shape shape_;
};

template <typename T>
Tensor Tensor::from_vector(DType dtype, Shape shape, const std::vector<T>& values) {
  Tensor t = empty(dtype, std::move(shape));
  T* p = t.data<T>();
  for (size_t i = 0; i < values.size() && static_cast<int64_t>(i) < t.numel(); ++i)
    p[i] = values[i];
  return t;
}

}  // namespace graphtrain
