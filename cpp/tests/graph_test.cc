#include <gtest/gtest.h>

#include <random>

#include "graphtrain/error.h"
#include "graphtrain/onnx_io.h"
#include "graphtrain/ops.h"
#include "graphtrain/session.h"
#include "graphtrain/verifier.h"
#include "test_graphs.h"

namespace graphtrain {
namespace {

TEST(Graph, TopologicalOrderAndCycles) {
  Graph g = testing::small_mlp();
  auto order = g.topological_order();
  ASSERT_EQ(order.size(), 5u);
  EXPECT_EQ(order.front()->op_type, "MatMul");
  EXPECT_EQ(order.back()->op_type, "Reshape");
  // Close a cycle: MatMul reads the Relu's output.
  Node* relu = order[2];
  g.replace_input(order[0], 0, relu->outputs()[0]);
  try {
    g.topological_order();
    FAIL() << "no cycle found";
  } catch (const GraphError& e) {
    EXPECT_NE(std::string(e.what()).find("cycle"), std::string::npos);
  }
}

TEST(Graph, RemoveAndReplace) {
  Graph g = testing::small_mlp();
  Node* relu = g.topological_order()[2];
  EXPECT_THROW(g.remove_node(relu), GraphError);  // still used
  g.replace_all_uses(relu->outputs()[0], relu->inputs()[0]);
  g.remove_node(relu);
  EXPECT_EQ(g.num_nodes(), 4u);
  verify(g);
}

TEST(Verifier, DanglingOutputAndTypeMismatch) {
  Graph g;
  g.opset_imports[""] = 18;
  Value* a = g.add_input("a", {DType::kFloat32, SymShape{SymDim(2)}});
  Value* b = g.add_input("b", {DType::kInt64, SymShape{SymDim(2)}});
  Value* c = g.add_op("Add", {a, b});
  g.add_output(c);
  try {
    verify(g);
    FAIL();
  } catch (const GraphError& e) {
    EXPECT_NE(std::string(e.what()).find("'a' is float32, 'b' is int64"), std::string::npos)
        << e.what();
  }
}

TEST(ShapeInference, SymbolicDimsPropagate) {
  Graph g = testing::small_mlp();
  infer_shapes(g);
  Value* y = g.outputs()[0];
  ASSERT_TRUE(y->type.shape);
  EXPECT_EQ(sym_shape_to_string(*y->type.shape), "[batch, 2, 2]");
  EXPECT_EQ(y->type.dtype, DType::kFloat32);
}

TEST(ShapeInference, UnknownOpsGiveUnknownShapesNotErrors) {
  Graph g;
  Value* x = g.add_input("x", {DType::kFloat32, SymShape{SymDim(3)}});
  Node* n = g.add_node("Mystery", {x}, {"m"}, "my.ops");
  Value* r = g.add_op("Relu", {n->outputs()[0]});
  g.add_output(r);
  EXPECT_NO_THROW(infer_shapes(g));
  EXPECT_FALSE(r->type.shape);
}

TEST(ShapeInference, CustomInfererCanBeRegistered) {
  register_shape_inferer("my.ops", "Double", [](InferenceContext& ctx) {
    SymShape s = *ctx.input_shape(0);
    s[0] = s[0] * 2;
    ctx.set_output(0, ctx.input_dtype(0), s);
  });
  Graph g;
  Value* x = g.add_input("x", {DType::kFloat32, SymShape{SymDim::symbol("n")}});
  Node* n = g.add_node("Double", {x}, {"d"}, "my.ops");
  g.add_output(n->outputs()[0]);
  infer_shapes(g);
  EXPECT_EQ(n->outputs()[0]->type.shape->at(0).to_string(), "2*n");
}

TEST(OnnxIo, RoundTripKeepsEverything) {
  Graph g = testing::small_mlp();
  std::string bytes = serialize_onnx(g);
  Graph back = parse_onnx(bytes, "roundtrip");
  EXPECT_EQ(back.num_nodes(), g.num_nodes());
  EXPECT_EQ(back.inputs()[0]->type.to_string(), "float32[batch, 8]");
  EXPECT_EQ(back.get("W")->initializer.numel(), 32);
  EXPECT_EQ(back.get("W")->initializer.data<float>()[5], g.get("W")->initializer.data<float>()[5]);
  EXPECT_EQ(back.get("y")->producer()->scope, "head");
  EXPECT_EQ(back.opset(""), 18);
  EXPECT_EQ(serialize_onnx(back), bytes);
}

TEST(OnnxIo, TruncatedModelsAreCleanErrors) {
  std::string bytes = serialize_onnx(testing::small_mlp());
  for (size_t keep = 0; keep < bytes.size(); keep += 7) {
    try {
      Graph g = parse_onnx(bytes.substr(0, keep), "cut");
      Session s(std::move(g));
    } catch (const Error&) {
    }
  }
}

// Seeded corruption loop: the loader, verifier, shape inference and planner see 100,000 mutated
// models (bytes flipped, cut, duplicated, dropped); each must load or fail with an Error.
TEST(OnnxIo, FuzzedModelsNeverCrash) {
  std::string base = serialize_onnx(testing::small_mlp());
  std::mt19937_64 rng(12345);
  int loaded = 0, rejected = 0;
  for (int iter = 0; iter < 100000; ++iter) {
    std::string m = base;
    int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits && !m.empty(); ++e) {
      size_t pos = rng() % m.size();
      switch (rng() % 5) {
        case 0:
          m[pos] = static_cast<char>(rng());
          break;
        case 1:
          m[pos] ^= static_cast<char>(1u << (rng() % 8));
          break;
        case 2:
          m.resize(pos);
          break;
        case 3:
          m.insert(pos, m.substr(pos, rng() % 16));
          break;
        case 4:
          m.erase(pos, rng() % 16);
          break;
      }
    }
    try {
      Graph g = parse_onnx(m, "fuzz");
      Session s(std::move(g));
      ++loaded;
    } catch (const Error&) {
      ++rejected;
    }
  }
  EXPECT_EQ(loaded + rejected, 100000);
  EXPECT_GT(rejected, 1000);
}

}  // namespace
}  // namespace graphtrain
