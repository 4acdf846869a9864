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

namespace graphtrain::testing {

// loss = cross_entropy(relu(x @ W1 + b1) @ W2 + b2, labels); x float32[batch, 4], 3 classes.
inline Graph mlp_with_loss() {
  Graph g;
  g.name = "mlp_with_loss";
  g.opset_imports[""] = 18;
  Value* x = g.add_input("x", {DType::kFloat32, SymShape{SymDim::symbol("batch"), SymDim(4)}});
  Value* labels = g.add_input("labels", {DType::kInt64, SymShape{SymDim::symbol("batch")}});
  std::vector<float> w1(4 * 8), w2(8 * 3);
  for (size_t i = 0; i < w1.size(); ++i) w1[i] = 0.05f * static_cast<float>((i * 7) % 11) - 0.25f;
  for (size_t i = 0; i < w2.size(); ++i) w2[i] = 0.04f * static_cast<float>((i * 5) % 13) - 0.2f;
  Value* W1 = g.add_initializer("W1", Tensor::from_vector(DType::kFloat32, {4, 8}, w1));
  Value* B1 = g.add_initializer("B1", Tensor::zeros(DType::kFloat32, {8}));
  Value* W2 = g.add_initializer("W2", Tensor::from_vector(DType::kFloat32, {8, 3}, w2));
  Value* B2 = g.add_initializer("B2", Tensor::zeros(DType::kFloat32, {3}));
  Value* h = g.add_op("Relu", {g.add_op("Add", {g.add_op("MatMul", {x, W1}), B1})});
  Value* logits = g.add_op("Add", {g.add_op("MatMul", {h, W2}), B2});
  Node* loss = g.add_node("SoftmaxCrossEntropyLoss", {logits, labels}, {"loss"});
  g.add_output(loss->outputs()[0]);
  return g;
}

}  // namespace graphtrain::testing
