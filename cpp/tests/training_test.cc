#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>

#include "graphtrain/autodiff.h"
#include "graphtrain/error.h"
#include "graphtrain/training_session.h"
#include "test_graphs.h"

namespace graphtrain {
namespace {

std::map<std::string, Tensor> batch() {
  std::vector<float> x(6 * 4);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 3) % 7) * 0.3f - 0.9f;
  return {{"x", Tensor::from_vector(DType::kFloat32, {6, 4}, x)},
          {"labels", Tensor::from_vector<int64_t>(DType::kInt64, {6}, {0, 1, 2, 2, 1, 0})}};
}

TEST(Autodiff, BiasGradientStashesNoShape) {
  GradientGraphs gg =
      build_gradient_graphs(testing::mlp_with_loss(), {{"loss"}, true, {"W1", "B1", "W2", "B2"}});
  for (const auto& s : gg.stashed) EXPECT_EQ(s.find("Shape"), std::string::npos) << s;
  EXPECT_EQ(gg.grads.size(), 4u);
  EXPECT_TRUE(gg.grad_inputs.empty());
}

// The backward runs in the order the builder emitted it: each layer's weight gradient right after
// the gradient reaching that layer, not all of them after the whole input-gradient chain (which
// would keep every layer's output gradient alive, and hold back ZeRO's gradient reductions).
TEST(Autodiff, EachLayerWeightGradientBeforeTheLayerBelow) {
  Graph g;
  g.name = "deep";
  g.opset_imports[""] = 18;
  Value* h = g.add_input("x", {DType::kFloat32, SymShape{SymDim(2), SymDim(4)}});
  std::vector<std::string> weights;
  for (int layer = 0; layer < 4; ++layer) {
    std::string w = "W" + std::to_string(layer);
    weights.push_back(w);
    Value* wv = g.add_input(w, {DType::kFloat32, SymShape{SymDim(4), SymDim(4)}});
    h = g.add_op("Relu", {g.add_op("MatMul", {h, wv})});
  }
  Node* sum = g.add_node("ReduceSum", {h}, {"loss"});
  sum->attributes["keepdims"] = Attribute::of(int64_t{0});
  g.add_output(sum->outputs()[0]);
  GradientGraphs gg = build_gradient_graphs(g, {{"loss"}, true, weights});
  std::vector<Node*> order = gg.backward.topological_order();
  auto position = [&](const std::string& output) {  // of the node computing it
    const Node* n = gg.backward.find(output)->producer();
    while (n->op_type == "Identity") n = n->input(0)->producer();
    return static_cast<size_t>(std::find(order.begin(), order.end(), n) - order.begin());
  };
  std::vector<size_t> relu_grads;  // in the order they run: layer 3's first
  for (size_t k = 0; k < order.size(); ++k)
    if (order[k]->op_type.find("Relu") != std::string::npos) relu_grads.push_back(k);
  ASSERT_EQ(relu_grads.size(), 4u);
  for (int layer = 3; layer >= 1; --layer) {
    // W_layer's gradient comes before the gradient goes through the Relu of the layer below
    size_t below = relu_grads[static_cast<size_t>(4 - layer)];
    EXPECT_LT(position(gg.grads[static_cast<size_t>(layer)]), below) << "W" << layer;
  }
}

// A Transpose the backward reads (attention's per-head q, k, v) is recomputed there from its
// input rather than stashed, so that both graphs can fold it into their GEMMs.
TEST(Autodiff, TransposesAreRecomputedInTheBackwardNotStashed) {
  Graph g;
  g.name = "heads";
  g.opset_imports[""] = 18;
  Value* x = g.add_input("x", {DType::kFloat32, SymShape{SymDim(2), SymDim(3), SymDim(4)}});
  Value* w = g.add_input("W", {DType::kFloat32, SymShape{SymDim(2), SymDim(4), SymDim(4)}});
  Node* t = g.add_node("Transpose", {x}, {"xt"});
  t->attributes["perm"] = Attribute::of(std::vector<int64_t>{0, 2, 1});
  Value* y = g.add_op("MatMul", {w, t->outputs()[0]});
  Node* sum = g.add_node("ReduceSum", {g.add_op("Mul", {y, y})}, {"loss"});
  sum->attributes["keepdims"] = Attribute::of(int64_t{0});
  g.add_output(sum->outputs()[0]);
  GradientGraphs gg = build_gradient_graphs(g, {{"loss"}, true, {"W"}});
  EXPECT_EQ(std::count(gg.stashed.begin(), gg.stashed.end(), "xt"), 0);
  EXPECT_EQ(std::count(gg.stashed.begin(), gg.stashed.end(), "x"), 1);  // the same bytes instead
  bool recomputed = false;
  for (const Node* n : gg.backward.nodes())
    if (n->op_type == "Transpose" && n->input(0)->name() == "x") recomputed = true;
  EXPECT_TRUE(recomputed);

  // Read in the backward by an op that cannot fold it (here Mul's gradient), it stays stashed.
  Graph h;
  h.name = "square";
  h.opset_imports[""] = 18;
  Value* a = h.add_input("a", {DType::kFloat32, SymShape{SymDim(3), SymDim(4)}});
  Node* ta = h.add_node("Transpose", {a}, {"at"});
  ta->attributes["perm"] = Attribute::of(std::vector<int64_t>{1, 0});
  Value* at = ta->outputs()[0];
  Node* loss = h.add_node("ReduceSum", {h.add_op("Mul", {at, at})}, {"loss"});
  loss->attributes["keepdims"] = Attribute::of(int64_t{0});
  h.add_output(loss->outputs()[0]);
  GradientGraphs hg = build_gradient_graphs(h, {{"loss"}, true, {"a"}});
  EXPECT_EQ(std::count(hg.stashed.begin(), hg.stashed.end(), "at"), 1);
  for (const Node* n : hg.backward.nodes()) {
    if (n->op_type == "Transpose") {
      EXPECT_NE(n->input(0)->name(), "a") << n->name;
    }
  }
}

TEST(TrainingSession, LossFallsAndCheckpointsRoundTrip) {
  TrainingConfig cfg;
  cfg.optimizer.lr = 0.05;
  TrainingSession ts(testing::mlp_with_loss(), cfg);
  EXPECT_EQ(ts.parameter_names().size(), 4u);
  float first = 0, last = 0;
  for (int i = 0; i < 40; ++i) {
    ts.zero_grad();
    last = ts.train_step(batch());
    if (i == 0) first = last;
    ts.optimizer_step();
  }
  EXPECT_LT(last, first * 0.5f);
  std::string path = ::testing::TempDir() + "gt_ck.onnx";
  ts.save_checkpoint(path);
  TrainingSession again(testing::mlp_with_loss(), cfg);
  again.load_checkpoint(path);
  EXPECT_EQ(again.optimizer_steps(), 40);
  EXPECT_FLOAT_EQ(again.eval_step(batch()), ts.eval_step(batch()));
  std::remove(path.c_str());
}

TEST(TrainingSession, ErrorsNameTheProblem) {
  TrainingConfig cfg;
  cfg.loss = "nope";
  EXPECT_THROW(TrainingSession(testing::mlp_with_loss(), cfg), GraphError);
  TrainingSession ts(testing::mlp_with_loss(), TrainingConfig{});
  auto b = batch();
  b.erase("labels");
  EXPECT_THROW(ts.train_step(b), InputError);
  OptimizerConfig bad;
  bad.kind = "lion";
  EXPECT_THROW(ts.set_optimizer(bad), OptionError);
}

}  // namespace
}  // namespace graphtrain
