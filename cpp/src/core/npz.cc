#include "graphtrain/npz.h"

#include <zlib.h>

#include <cstring>

#include "graphtrain/error.h"
#include "graphtrain/file_util.h"
#include "graphtrain/strings.h"

namespace graphtrain {
namespace {

uint64_t le(const std::string& b, size_t at, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i)
    v |= static_cast<uint64_t>(static_cast<uint8_t>(b[at + i])) << (8 * i);
  return v;
}

// The value of `key` in a numpy header dict, e.g. 'descr': '<f4'.
std::string header_field(const std::string& header, const std::string& key) {
  size_t k = header.find("'" + key + "'");
  if (k == std::string::npos) return "";
  size_t colon = header.find(':', k);
  if (colon == std::string::npos) return "";
  size_t start = header.find_first_not_of(' ', colon + 1);
  if (start == std::string::npos) return "";
  if (header[start] == '(') return header.substr(start, header.find(')', start) - start + 1);
  size_t end = header.find_first_of(",}", start);
  return header.substr(start, end - start);
}

DType npy_dtype(const std::string& descr, const std::string& origin) {
  std::string d = descr;
  if (d.size() >= 2 && d.front() == '\'' && d.back() == '\'') d = d.substr(1, d.size() - 2);
  if (d.size() >= 2 && d[0] == '>' && d.substr(1) != "u1" && d.substr(1) != "i1" &&
      d.substr(1) != "b1")
    throw ModelFileError(origin + ": big-endian arrays (" + d + ") are not supported");
  std::string t = d.size() >= 2 ? d.substr(1) : d;
  if (t == "f4") return DType::kFloat32;
  if (t == "f8") return DType::kFloat64;
  if (t == "f2") return DType::kFloat16;
  if (t == "i8") return DType::kInt64;
  if (t == "i4") return DType::kInt32;
  if (t == "i1") return DType::kInt8;
  if (t == "u1") return DType::kUInt8;
  if (t == "b1") return DType::kBool;
  throw ModelFileError(origin + ": array type " + d +
                       " is not supported (use float32, int64, int32 or bool)");
}

std::string inflate_raw(const std::string& data, uint64_t size, const std::string& origin) {
  std::string out(size, '\0');
  z_stream z{};
  if (inflateInit2(&z, -MAX_WBITS) != Z_OK) throw ModelFileError(origin + ": zlib failed to start");
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  z.avail_in = static_cast<uInt>(data.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  int rc = inflate(&z, Z_FINISH);
  uint64_t produced = z.total_out;
  inflateEnd(&z);
  if (rc != Z_STREAM_END || produced != size)
    throw ModelFileError(origin + ": corrupted compressed data");
  return out;
}

}  // namespace

Tensor parse_npy(const std::string& b, const std::string& origin) {
  if (b.size() < 10 || b.compare(0, 6, "\x93NUMPY") != 0)
    throw ModelFileError(origin + ": not a .npy array");
  int major = static_cast<uint8_t>(b[6]);
  size_t header_len = major == 1 ? le(b, 8, 2) : le(b, 8, 4);
  size_t start = major == 1 ? 10 : 12;
  if (start + header_len > b.size()) throw ModelFileError(origin + ": truncated .npy header");
  std::string header = b.substr(start, header_len);
  DType dtype = npy_dtype(header_field(header, "descr"), origin);
  if (header_field(header, "fortran_order").find("True") != std::string::npos)
    throw ModelFileError(origin +
                         ": Fortran-ordered arrays are not supported (save np.ascontiguousarray)");
  std::string shape_text = header_field(header, "shape");
  Shape shape;
  for (size_t i = 0; i < shape_text.size();) {
    if (std::isdigit(static_cast<unsigned char>(shape_text[i]))) {
      size_t j = i;
      while (j < shape_text.size() && std::isdigit(static_cast<unsigned char>(shape_text[j]))) ++j;
      shape.push_back(std::stoll(shape_text.substr(i, j - i)));
      i = j;
    } else {
      ++i;
    }
  }
  size_t data_at = start + header_len;
  uint64_t count = 1;
  for (int64_t d : shape) count *= static_cast<uint64_t>(d);
  uint64_t nbytes = count * dtype_size(dtype);
  if (b.size() - data_at < nbytes)
    throw ModelFileError(str_cat(origin, ": holds ", b.size() - data_at,
                                 " bytes of data, its shape ", shape, " needs ", nbytes));
  Tensor t = Tensor::empty(dtype, shape);
  if (nbytes) std::memcpy(t.raw_data(), b.data() + data_at, nbytes);
  return t;
}

std::map<std::string, Tensor> load_npz(const std::string& path) {
  std::string b = read_file(path);
  auto fail = [&](const std::string& what) -> void {
    throw ModelFileError("'" + path + "': " + what);
  };
  // End of central directory: the last 0x06054b50 in the file.
  size_t eocd = std::string::npos;
  for (size_t i = b.size() >= 22 ? b.size() - 22 : 0; i + 1 > 0 && i + 4 <= b.size(); --i) {
    if (le(b, i, 4) == 0x06054b50) {
      eocd = i;
      break;
    }
    if (i == 0) break;
  }
  if (eocd == std::string::npos) fail("not an .npz (zip) archive");
  uint64_t entries = le(b, eocd + 10, 2), cd_offset = le(b, eocd + 16, 4);
  if (cd_offset == 0xffffffffu || entries == 0xffffu) {  // zip64
    if (eocd < 20 || le(b, eocd - 20, 4) != 0x07064b50) fail("zip64 locator missing");
    uint64_t z64 = le(b, eocd - 20 + 8, 8);
    if (z64 + 56 > b.size() || le(b, z64, 4) != 0x06064b50) fail("zip64 directory missing");
    entries = le(b, z64 + 32, 8);
    cd_offset = le(b, z64 + 48, 8);
  }
  std::map<std::string, Tensor> out;
  size_t at = cd_offset;
  for (uint64_t e = 0; e < entries; ++e) {
    if (at + 46 > b.size() || le(b, at, 4) != 0x02014b50) fail("corrupted central directory");
    uint64_t method = le(b, at + 10, 2);
    uint64_t csize = le(b, at + 20, 4), usize = le(b, at + 24, 4);
    size_t name_len = le(b, at + 28, 2), extra_len = le(b, at + 30, 2),
           comment_len = le(b, at + 32, 2);
    uint64_t local = le(b, at + 42, 4);
    std::string name = b.substr(at + 46, name_len);
    // zip64 extra field: the 0xffffffff sizes and offset, in that order.
    size_t x = at + 46 + name_len, xend = x + extra_len;
    while (x + 4 <= xend && xend <= b.size()) {
      uint64_t id = le(b, x, 2), len = le(b, x + 2, 2);
      size_t p = x + 4;
      if (id == 1) {
        if (usize == 0xffffffffu) {
          usize = le(b, p, 8);
          p += 8;
        }
        if (csize == 0xffffffffu) {
          csize = le(b, p, 8);
          p += 8;
        }
        if (local == 0xffffffffu) {
          local = le(b, p, 8);
          p += 8;
        }
      }
      x += 4 + len;
    }
    at += 46 + name_len + extra_len + comment_len;
    if (local + 30 > b.size() || le(b, local, 4) != 0x04034b50)
      fail("corrupted entry '" + name + "'");
    size_t data = local + 30 + le(b, local + 26, 2) + le(b, local + 28, 2);
    if (data + csize > b.size()) fail("entry '" + name + "' is truncated");
    std::string raw = b.substr(data, csize);
    std::string origin = "'" + path + "' array '" + name + "'";
    if (method == 8)
      raw = inflate_raw(raw, usize, origin);
    else if (method != 0)
      fail("entry '" + name + "' uses compression method " + std::to_string(method));
    std::string key = name.size() > 4 && name.compare(name.size() - 4, 4, ".npy") == 0
                          ? name.substr(0, name.size() - 4)
                          : name;
    out[key] = parse_npy(raw, origin);
  }
  return out;
}

}  // namespace graphtrain
