// Element types of tensors and their ONNX and DLPack codes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace graphtrain {

enum class DType : uint8_t {
  kUndefined = 0,
  kFloat32,
  kFloat16,
  kBFloat16,
  kFloat64,
  kInt64,
  kInt32,
  kInt8,
  kUInt8,
  kBool,
};

size_t dtype_size(DType dtype);
const char* to_string(DType dtype);
bool is_floating(DType dtype);
bool is_integer(DType dtype);  // signed or unsigned, not bool

// ONNX TensorProto.DataType codes; kUndefined for codes graphtrain does not hold.
int to_onnx(DType dtype);
DType from_onnx(int code);
// Name of an ONNX data type code, also for the ones graphtrain does not hold ("STRING", "INT16").
const char* onnx_type_name(int code);

// Conversions between float and the 16-bit float formats (round to nearest even).
uint16_t float_to_half(float f);
float half_to_float(uint16_t h);
uint16_t float_to_bfloat16(float f);
inline float bfloat16_to_float(uint16_t b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

}  // namespace graphtrain
