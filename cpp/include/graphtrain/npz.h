// Reading numpy .npy arrays and .npz archives (stored or deflated, zip64 included).
#pragma once

#include <map>
#include <string>

#include "graphtrain/tensor.h"

namespace graphtrain {

// Throws ModelFileError naming the file (and array) and what is wrong.
Tensor parse_npy(const std::string& bytes, const std::string& origin);
std::map<std::string, Tensor> load_npz(const std::string& path);

}  // namespace graphtrain
