// Callback nodes: Hook / HookGrad through a host callback, the context from forward to backward,
// dead-code elimination, the missing-host error, and PythonOp shape inference.
#include <gtest/gtest.h>

#include <algorithm>

#include "graphtrain/autodiff.h"
#include "graphtrain/callback.h"
#include "graphtrain/error.h"
#include "graphtrain/ops.h"
#include "graphtrain/passes.h"
#include "graphtrain/session.h"

namespace graphtrain {
namespace {

constexpr const char* GT = kGraphtrainDomain;

// loss = sum(Hook(x)^2), x float32[batch, 3]
Graph hooked_graph() {
  Graph g;
  g.name = "hooked";
  g.opset_imports[""] = 18;
  g.opset_imports[GT] = 1;
  Value* x = g.add_input("x", {DType::kFloat32, SymShape{SymDim::symbol("batch"), SymDim(3)}});
  Node* hook = g.add_node("Hook", {x}, {"y", "ctx"}, GT);
  hook->attributes["module"] = Attribute::of(std::string("layer"));
  hook->attributes["kind"] = Attribute::of(std::string("post"));
  hook->attributes["num_passive"] = Attribute::of(int64_t{0});
  Value* y = hook->outputs()[0];
  Value* sq = g.add_op("Mul", {y, y});
  Node* sum = g.add_node("ReduceSum", {sq}, {"loss"});
  sum->attributes["keepdims"] = Attribute::of(int64_t{0});
  g.add_output(sum->outputs()[0]);
  return g;
}

// The host doubles the tensor in forward and its gradient in backward, and checks the context.
struct Doubler {
  int forward_calls = 0, backward_calls = 0;
  std::vector<Tensor> operator()(const Node& node, const std::vector<Tensor>& in) {
    auto doubled = [](const Tensor& t) {
      Tensor out = Tensor::empty(t.dtype(), t.shape());
      for (int64_t i = 0; i < t.numel(); ++i) out.data<float>()[i] = 2 * t.data<float>()[i];
      return out;
    };
    if (node.op_type == "Hook") {
      ++forward_calls;
      EXPECT_EQ(node.attr_string("module", ""), "layer");
      return {doubled(in[0]), Tensor::scalar_int64(41)};
    }
    ++backward_calls;
    EXPECT_EQ(node.op_type, "HookGrad");
    EXPECT_EQ(*in[0].data<int64_t>(), 41);  // the forward's context reached the backward
    return {doubled(in[1])};
  }
};

TEST(Callbacks, HookRunsInForwardAndItsGradientInBackward) {
  auto host = std::make_shared<Doubler>();
  set_host_callback(
      [host](const Node& n, const std::vector<Tensor>& in) { return (*host)(n, in); });
  GradientGraphs gg = build_gradient_graphs(hooked_graph(), {{"loss"}, true, {"x"}});
  // The hook's context is kept for the backward like any value it reads.
  EXPECT_NE(std::find(gg.stashed.begin(), gg.stashed.end(), "ctx"), gg.stashed.end());
  Session fwd(std::move(gg.forward)), bwd(std::move(gg.backward));
  std::vector<float> xs = {1, -2, 3, 0.5f, 0, -1};
  Tensor x = Tensor::from_vector(DType::kFloat32, {2, 3}, xs);
  std::vector<Tensor> out = fwd.run(std::vector<Tensor>{x});
  float expect = 0;
  for (float v : xs) expect += 4 * v * v;
  EXPECT_FLOAT_EQ(*out[0].data<float>(), expect);
  std::vector<Tensor> grads = bwd.run(std::vector<Tensor>(out.begin() + 1, out.end()));
  ASSERT_EQ(grads.size(), 1u);
  for (size_t i = 0; i < xs.size();
       ++i)  // d/dx sum((2x)^2) = 8x, with the hook's doubling: 2 * 2 * 2x
    EXPECT_FLOAT_EQ(grads[0].data<float>()[i], 8 * xs[i]);
  EXPECT_EQ(host->forward_calls, 1);
  EXPECT_EQ(host->backward_calls, 1);
  set_host_callback({});
}

TEST(Callbacks, WithoutAHostTheErrorNamesTheNode) {
  set_host_callback({});
  Session s(hooked_graph());
  try {
    s.run(std::vector<Tensor>{Tensor::zeros(DType::kFloat32, {1, 3})});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("Hook"), std::string::npos) << m;
    EXPECT_NE(m.find("no Python host"), std::string::npos) << m;
  }
}

TEST(Callbacks, DeadCodeEliminationKeepsHooks) {
  Graph g = hooked_graph();
  Value* x = g.get("x");
  Node* side = g.add_node("Hook", {x}, {"unused", "unused_ctx"}, GT);
  side->attributes["num_passive"] = Attribute::of(int64_t{0});
  g.add_op("Relu", {x});  // dead
  EXPECT_EQ(eliminate_dead_nodes(g), 1u);
  EXPECT_NE(g.find("unused"), nullptr);
}

// ZeRO stage 3: loss = sum(x @ reshape(ShardGather(x, shard), [3, 2])), a "world" of 2 ranks whose
// shards the host gathers as [shard, 10 * shard].
Graph sharded_graph() {
  Graph g;
  g.name = "sharded";
  g.opset_imports[""] = 18;
  g.opset_imports[GT] = 1;
  Value* x = g.add_input("x", {DType::kFloat32, SymShape{SymDim::symbol("batch"), SymDim(3)}});
  Value* shard = g.add_input("shard", {DType::kFloat32, SymShape{SymDim(3)}});
  Node* gather = g.add_node("ShardGather", {x, shard}, {"full"}, GT);
  gather->attributes["num_passive"] = Attribute::of(int64_t{1});
  gather->attributes["group"] = Attribute::of(int64_t{4});
  gather->attributes["padded"] = Attribute::of(int64_t{6});
  gather->attributes["shard_size"] = Attribute::of(int64_t{3});
  Value* shape = g.add_initializer(
      "w_shape", Tensor::from_vector(DType::kInt64, {2}, std::vector<int64_t>{3, 2}));
  Node* w = g.add_node("Reshape", {gather->outputs()[0], shape}, {"w"});
  Value* y = g.add_op("MatMul", {x, w->outputs()[0]});
  Node* sum = g.add_node("ReduceSum", {y}, {"loss"});
  sum->attributes["keepdims"] = Attribute::of(int64_t{0});
  g.add_output(sum->outputs()[0]);
  return g;
}

TEST(Callbacks, ShardedParametersAreGatheredAgainInBackwardNotStashed) {
  int gathers = 0, recomputed = 0, scatters = 0;
  set_host_callback([&](const Node& n, const std::vector<Tensor>& in) -> std::vector<Tensor> {
    EXPECT_EQ(n.attr_int("group", -1), 4);
    if (n.op_type == "ShardGather") {
      ++gathers;
      recomputed += n.attr_int("recompute", 0) == 1;
      const Tensor& shard = in.back();
      std::vector<float> full(6);
      for (int i = 0; i < 3; ++i) {
        full[static_cast<size_t>(i)] = shard.data<float>()[i];
        full[static_cast<size_t>(i) + 3] = 10 * shard.data<float>()[i];
      }
      return {Tensor::from_vector(DType::kFloat32, {6}, full)};
    }
    EXPECT_EQ(n.op_type, "ShardGatherGrad");
    ++scatters;
    const float* d = in[0].data<float>();  // this rank's part of the sum over the "ranks"
    return {Tensor::from_vector(
        DType::kFloat32, {3},
        std::vector<float>{d[0] + 10 * d[3], d[1] + 10 * d[4], d[2] + 10 * d[5]})};
  });
  GradientGraphs gg = build_gradient_graphs(sharded_graph(), {{"loss"}, true, {"x", "shard"}});
  for (const std::string& name : gg.stashed) {
    EXPECT_NE(name, "full");
    EXPECT_NE(name, "w");
  }
  int again = 0;
  for (Node* n : gg.backward.nodes())
    if (n->op_type == "ShardGather") {
      ++again;
      EXPECT_EQ(n->attr_int("recompute", 0), 1);
      EXPECT_EQ(n->attr_int("num_passive", 0), 1);  // anchored to the gradient reaching it
    }
  EXPECT_EQ(again, 1);
  Session fwd(std::move(gg.forward)), bwd(std::move(gg.backward));
  Tensor x = Tensor::from_vector(DType::kFloat32, {1, 3}, std::vector<float>{1, 2, 3});
  Tensor shard = Tensor::from_vector(DType::kFloat32, {3}, std::vector<float>{1, -1, 2});
  std::vector<Tensor> out = fwd.run(std::vector<Tensor>{x, shard});
  // w = [[1, -1], [2, 10], [-10, 20]]: x @ w = [1 + 4 - 30, -1 + 20 + 60] = [-25, 79]
  EXPECT_FLOAT_EQ(*out[0].data<float>(), 54);
  std::vector<Tensor> grads = bwd.run(std::vector<Tensor>(out.begin() + 1, out.end()));
  ASSERT_EQ(grads.size(), 2u);
  // dx = row sums of w; dw = x^T @ ones = [[1, 1], [2, 2], [3, 3]] flattened [1, 1, 2, 2, 3, 3]
  std::vector<float> dx = {0, 12, 10}, dshard = {1 + 20, 1 + 30, 2 + 30};
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_FLOAT_EQ(grads[0].data<float>()[i], dx[i]);
    EXPECT_FLOAT_EQ(grads[1].data<float>()[i], dshard[i]);
  }
  EXPECT_EQ(gathers, 2);
  EXPECT_EQ(recomputed, 1);
  EXPECT_EQ(scatters, 1);
  set_host_callback({});
}

Graph python_op_graph(const std::string& func) {
  Graph g;
  g.name = "pyop";
  g.opset_imports[""] = 18;
  g.opset_imports[GT] = 1;
  Value* x = g.add_input("x", {DType::kFloat32, SymShape{SymDim::symbol("batch"), SymDim(5)}});
  Node* n = g.add_node("PythonOp", {x}, {"y", "ctx"}, GT);
  n->attributes["func_name"] = Attribute::of(func);
  n->attributes["output_ranks"] = Attribute::of(std::vector<int64_t>{2});
  n->attributes["output_dtypes"] = Attribute::of(std::vector<int64_t>{1});
  g.add_output(g.add_op("Relu", {n->outputs()[0]}));
  return g;
}

TEST(Callbacks, PythonOpShapesFromItsInfererOrFreshDims) {
  Graph fresh = python_op_graph("tests.NoInferer");
  infer_shapes(fresh);
  const SymShape& s = *fresh.get("y")->type.shape;
  ASSERT_EQ(s.size(), 2u);
  EXPECT_FALSE(s[0] == SymDim::symbol("batch"));
  EXPECT_FALSE(s[1].constant().has_value());

  register_python_op_inferer("tests.Same",
                             [](const Node&, const PythonOpShapes& in) { return in; });
  Graph same = python_op_graph("tests.Same");
  infer_shapes(same);
  EXPECT_EQ(same.get("y")->type.to_string(), "float32[batch, 5]");
  EXPECT_EQ(same.outputs()[0]->type.to_string(), "float32[batch, 5]");  // flows on

  register_python_op_inferer("tests.Bad",
                             [](const Node&, const PythonOpShapes&) { return PythonOpShapes{}; });
  Graph bad = python_op_graph("tests.Bad");
  try {
    infer_shapes(bad);
    FAIL() << "expected an error";
  } catch (const GraphError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("'tests.Bad'"), std::string::npos) << m;
    EXPECT_NE(m.find("returned 0 shapes"), std::string::npos) << m;
  }
  register_python_op_inferer("tests.Same", {});
  register_python_op_inferer("tests.Bad", {});
}

}  // namespace
}  // namespace graphtrain
