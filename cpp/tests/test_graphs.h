// Graphs built in C++ for the engine's tests.
#pragma once

#include "graphtrain/graph.h"

namespace graphtrain::testing {

// y = softmax(relu(x @ W + b)) reshaped to [batch, 2, 2]; x is float32[batch, 8].
inline Graph small_mlp() {
  Graph g;
  g.name = "small_mlp";
  g.opset_imports[""] = 18;
  Value* x = g.add_input("x", {DType::kFloat32, SymShape{SymDim::symbol("batch"), SymDim(8)}});
  std::vector<float> w(32), b(4);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.01f * static_cast<float>(i) - 0.1f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = 0.1f * static_cast<float>(i);
  Value* W = g.add_initializer("W", Tensor::from_vector(DType::kFloat32, {8, 4}, w));
  Value* B = g.add_initializer("B", Tensor::from_vector(DType::kFloat32, {4}, b));
  Value* shape =
      g.add_initializer("shape", Tensor::from_vector<int64_t>(DType::kInt64, {3}, {0, 2, 2}));
  Value* h = g.add_op("MatMul", {x, W});
  h = g.add_op("Add", {h, B});
  h = g.add_op("Relu", {h});
  h = g.add_op("Softmax", {h}, {{"axis", Attribute::of(int64_t{-1})}});
  Node* r = g.add_node("Reshape", {h, shape}, {"y"});
  r->scope = "head";
  g.add_output(r->outputs()[0]);
  return g;
}

}  // namespace graphtrain::testing
