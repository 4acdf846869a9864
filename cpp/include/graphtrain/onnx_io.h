// Reading and writing real ONNX model files.
#pragma once

#include <cstddef>
#include <string>

#include "graphtrain/graph.h"

namespace graphtrain {

// Loads a model; external data files are read relative to the model's folder. Throws
// ModelFileError naming the file and what is wrong (truncated, corrupted, unsupported construct).
Graph load_onnx(const std::string& path);
// Parses a serialized model. `origin` names it in errors; `base_dir` locates external data.
Graph parse_onnx(const std::string& bytes, const std::string& origin = "<memory>",
                 const std::string& base_dir = "");

struct SaveOptions {
  // Initializers of at least this many bytes go to one external data file beside the model
  // ("<model file name>.data"); 0 keeps everything inside the model.
  size_t external_data_threshold = 0;
  // Force external data when the model would pass protobuf's 2 GB limit.
  bool auto_external_over_2gb = true;
};

// Writes atomically: a temporary file renamed into place, so readers never see half a model.
void save_onnx(const Graph& graph, const std::string& path, const SaveOptions& options = {});
std::string serialize_onnx(const Graph& graph);

}  // namespace graphtrain
