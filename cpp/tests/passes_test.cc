// Graph passes: each pass fires where it should, keeps graph outputs and callback nodes, and leaves
// results unchanged; the pipeline honors GRAPHTRAIN_ENABLE_COMPUTE_OPTIMIZER and
// GRAPHTRAIN_DISABLE_PASSES.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <optional>

#include "graphtrain/autodiff.h"
#include "graphtrain/error.h"
#include "graphtrain/memory_plan.h"
#include "graphtrain/ops.h"
#include "graphtrain/options.h"
#include "graphtrain/passes.h"
#include "graphtrain/session.h"

namespace graphtrain {
namespace {

constexpr const char* GT = kGraphtrainDomain;

size_t count(const Graph& g, const std::string& op) {
  size_t n = 0;
  for (Node* node : g.nodes()) n += node->op_type == op;
  return n;
}

// y = Relu(StopGradient(Identity(x))) + Identity(x); out = Identity(y) (a graph output); plus an
// Exp nothing reads.
Graph chain() {
  Graph g;
  g.name = "chain";
  g.opset_imports[""] = 18;
  g.opset_imports[GT] = 1;
  Value* x = g.add_input("x", {DType::kFloat32, SymShape{SymDim::symbol("n"), SymDim(3)}});
  Value* a = g.add_op("Identity", {x});
  Value* b = g.add_op("StopGradient", {a}, {}, GT);
  Value* r = g.add_op("Relu", {b});
  Value* y = g.add_op("Add", {r, a});
  g.add_op("Exp", {y});  // dead
  Node* out = g.add_node("Identity", {y}, {"out"});
  g.add_output(out->outputs()[0]);
  return g;
}

std::vector<float> run(Graph g) {
  Session s(std::move(g));
  Tensor x = Tensor::from_vector<float>(DType::kFloat32, {2, 3}, {-1, 2, -3, 4, -5, 6});
  Tensor y = s.run(std::vector<Tensor>{x})[0];
  return std::vector<float>(y.data<float>(), y.data<float>() + y.numel());
}

class PassesTest : public ::testing::Test {
 protected:
  void TearDown() override { Options::global().reload(); }
};

TEST_F(PassesTest, IdentitiesGoExceptAGraphOutput) {
  Graph g = chain();
  std::vector<float> before = run(clone_graph(g));
  EXPECT_EQ(eliminate_identities(g), 2u);  // Identity(x) and StopGradient; not the output's
  EXPECT_EQ(count(g, "Identity"), 1u);
  EXPECT_EQ(count(g, "StopGradient"), 0u);
  EXPECT_EQ(g.outputs()[0]->name(), "out");
  EXPECT_EQ(run(std::move(g)), before);
}

// A one-input Concat (a key/value cache's first step) is its input: read through where it is
// inner, an Identity (no copy) where its output is a graph output, whose name stays.
TEST_F(PassesTest, IdentitiesTakeOneInputConcats) {
  Graph g;
  g.opset_imports[""] = 18;
  Value* x = g.add_input("x", {DType::kFloat32, SymShape{SymDim::symbol("n"), SymDim(3)}});
  Value* inner = g.add_op("Concat", {g.add_op("Exp", {x})}, {{"axis", Attribute::of(int64_t{0})}});
  Value* r = g.add_op("Relu", {inner});
  Node* cache = g.add_node("Concat", {r}, {"cache"});
  cache->attributes["axis"] = Attribute::of(int64_t{-1});
  g.add_output(cache->output(0));
  // A one-input Concat of a graph input stays a copy at a graph output (no output aliases an
  // input), and so does one of a value something else reads too.
  Node* of_input = g.add_node("Concat", {x}, {"of_input"});
  of_input->attributes["axis"] = Attribute::of(int64_t{0});
  g.add_output(of_input->output(0));
  Value* shared = g.add_op("Neg", {x});
  Node* of_shared = g.add_node("Concat", {shared}, {"of_shared"});
  of_shared->attributes["axis"] = Attribute::of(int64_t{0});
  g.add_output(of_shared->output(0));
  g.add_output(shared);
  std::vector<float> before = run(clone_graph(g));
  EXPECT_EQ(eliminate_identities(g), 2u);
  EXPECT_EQ(count(g, "Concat"), 2u);
  EXPECT_EQ(count(g, "Identity"), 1u);
  EXPECT_EQ(g.outputs()[0]->name(), "cache");
  EXPECT_EQ(g.outputs()[0]->producer()->input(0), r);
  EXPECT_EQ(r->producer()->input(0)->producer()->op_type, "Exp");
  EXPECT_EQ(run(std::move(g)), before);
}

// A backward graph where gradient input z is zero: z + a becomes a (and the Identity that only fed
// the sum goes), z + b of a broadcast shape stays, and the graph's inputs stay; results match.
TEST_F(PassesTest, DropZeroGradientsDropsSumsWithAZeroGradient) {
  Graph g;
  g.opset_imports[""] = 18;
  SymShape s{SymDim(2), SymDim(3)};
  Value* z = g.add_input("z", {DType::kFloat32, s});
  Value* a = g.add_input("a", {DType::kFloat32, s});
  Value* b = g.add_input("b", {DType::kFloat32, SymShape{SymDim(3)}});
  Value* za = g.add_op("Identity", {z});
  Value* sum = g.add_op("Add", {za, g.add_op("Exp", {a})});
  g.add_output(g.add_op("Mul", {sum, a}));
  g.add_output(g.add_op("Add", {b, z}));
  infer_shapes(g);
  Tensor zeros = Tensor::from_vector(DType::kFloat32, {2, 3}, std::vector<float>(6, 0.0f));
  Tensor av = Tensor::from_vector(DType::kFloat32, {2, 3},
                                  std::vector<float>{0.1f, -0.2f, 0.3f, 0.4f, 0.5f, 0.6f});
  Tensor bv = Tensor::from_vector(DType::kFloat32, {3}, std::vector<float>{1.0f, 2.0f, 3.0f});
  std::vector<Tensor> before = Session(clone_graph(g)).run({zeros, av, bv});
  EXPECT_EQ(drop_zero_gradients(g, {"z"}), 1u);
  EXPECT_EQ(count(g, "Add"), 1u);
  EXPECT_EQ(count(g, "Identity"), 0u);
  EXPECT_EQ(g.inputs().size(), 3u);
  std::vector<Tensor> after = Session(std::move(g)).run({zeros, av, bv});
  ASSERT_EQ(after.size(), before.size());
  for (size_t o = 0; o < before.size(); ++o) {
    ASSERT_EQ(after[o].shape(), before[o].shape());
    for (int64_t i = 0; i < before[o].numel(); ++i)
      EXPECT_EQ(after[o].data<float>()[i], before[o].data<float>()[i]) << o << " " << i;
  }
}

// The zero follows linear ops: a cache output's gradient z goes through its Transpose, a Concat of
// only zeros, a Split and a product before it meets the other path's gradient a; the sum becomes
// a, and the chain that made the zero goes. A Concat of a zero and a nonzero value is not zero.
TEST_F(PassesTest, DropZeroGradientsFollowsTheZeroThroughLinearOps) {
  Graph g;
  g.opset_imports[""] = 18;
  Value* z = g.add_input("z", {DType::kFloat32, SymShape{SymDim(3), SymDim(2)}});
  Value* a = g.add_input("a", {DType::kFloat32, SymShape{SymDim(2), SymDim(3)}});
  Value* t = g.add_op("Transpose", {z}, {{"perm", Attribute::of(std::vector<int64_t>{1, 0})}});
  Value* both = g.add_op("Concat", {t, t}, {{"axis", Attribute::of(int64_t{1})}});
  Node* split = g.add_node("Split", {both}, {"s0", "s1"});
  split->attributes["axis"] = Attribute::of(int64_t{1});
  split->attributes["num_outputs"] = Attribute::of(int64_t{2});
  Value* product = g.add_op("Mul", {split->output(0), g.add_op("Exp", {a})});
  Value* sum = g.add_op("Add", {a, product});
  g.add_output(g.add_op("Neg", {sum}));
  Value* mixed = g.add_op("Concat", {split->output(1), a}, {{"axis", Attribute::of(int64_t{0})}});
  g.add_output(g.add_op("Add", {mixed, mixed}));
  infer_shapes(g);
  Tensor zeros = Tensor::from_vector(DType::kFloat32, {3, 2}, std::vector<float>(6, 0.0f));
  Tensor av = Tensor::from_vector(DType::kFloat32, {2, 3},
                                  std::vector<float>{0.1f, -0.2f, 0.3f, 0.4f, 0.5f, 0.6f});
  std::vector<Tensor> before = Session(clone_graph(g)).run(std::vector<Tensor>{zeros, av});
  EXPECT_EQ(drop_zero_gradients(g, {"z"}), 1u);
  EXPECT_EQ(count(g, "Mul"), 0u);
  EXPECT_EQ(count(g, "Add"), 1u);  // mixed + mixed: mixed is not zero
  EXPECT_EQ(count(g, "Split"), 1u);
  EXPECT_EQ(g.outputs()[0]->producer()->input(0), a);
  std::vector<Tensor> after = Session(std::move(g)).run(std::vector<Tensor>{zeros, av});
  ASSERT_EQ(after.size(), before.size());
  for (size_t o = 0; o < before.size(); ++o) {
    ASSERT_EQ(after[o].shape(), before[o].shape());
    for (int64_t i = 0; i < before[o].numel(); ++i)
      EXPECT_EQ(after[o].data<float>()[i], before[o].data<float>()[i]) << o << " " << i;
  }
}

TEST_F(PassesTest, DeadCodeGoesButCallbackNodesStay) {
  Graph g = chain();
  Value* x = g.get("x");
  Node* hook = g.add_node("Hook", {x}, {"h", "hctx"}, GT);  // nothing reads it: it still acts
  hook->attributes["num_passive"] = Attribute::of(int64_t{0});
  EXPECT_EQ(eliminate_dead_nodes(g), 1u);  // the Exp
  EXPECT_EQ(count(g, "Exp"), 0u);
  EXPECT_EQ(count(g, "Hook"), 1u);
}

TEST_F(PassesTest, PipelineRunsInOrderAndObeysTheSwitches) {
  std::vector<std::string> names;
  for (const Pass& p : pass_pipeline()) names.push_back(p.name);
  EXPECT_EQ(names, (std::vector<std::string>{
                       "recognize_gelu", "recognize_rms_norm", "recognize_rotary",
                       "recognize_silu_mul", "fold_pad_into_conv", "recognize_attention",
                       "fuse_loss_gradient", "stash_gelu_derivative", "identities",
                       "constant_folding", "dead_code", "fold_transposes", "fuse_softmax",
                       "fuse_layer_norm", "gelu_grad_from_output", "fuse_elementwise"}));
  Graph captured = chain();
  auto before = optimize_graph(captured, "test", true);  // the passes that precede autodiff
  ASSERT_EQ(before.size(), 8u);
  EXPECT_EQ(before[0], (std::pair<std::string, size_t>{"recognize_gelu", 0}));
  EXPECT_EQ(before[1], (std::pair<std::string, size_t>{"recognize_rms_norm", 0}));
  EXPECT_EQ(before[2], (std::pair<std::string, size_t>{"recognize_rotary", 0}));
  EXPECT_EQ(before[3], (std::pair<std::string, size_t>{"recognize_silu_mul", 0}));
  EXPECT_EQ(before[4], (std::pair<std::string, size_t>{"fold_pad_into_conv", 0}));
  EXPECT_EQ(before[5], (std::pair<std::string, size_t>{"recognize_attention", 0}));
  EXPECT_EQ(before[6], (std::pair<std::string, size_t>{"fuse_loss_gradient", 0}));
  EXPECT_EQ(before[7], (std::pair<std::string, size_t>{"stash_gelu_derivative", 0}));

  Graph g = chain();
  auto ran = optimize_graph(g, "test");
  ASSERT_EQ(ran.size(), 8u);
  EXPECT_EQ(ran[0], (std::pair<std::string, size_t>{"identities", 2}));
  EXPECT_EQ(ran[1], (std::pair<std::string, size_t>{"constant_folding", 0}));
  EXPECT_EQ(ran[2], (std::pair<std::string, size_t>{"dead_code", 1}));
  EXPECT_EQ(ran[3], (std::pair<std::string, size_t>{"fold_transposes", 0}));
  EXPECT_EQ(ran[4], (std::pair<std::string, size_t>{"fuse_softmax", 0}));
  EXPECT_EQ(ran[5], (std::pair<std::string, size_t>{"fuse_layer_norm", 0}));
  EXPECT_EQ(ran[6], (std::pair<std::string, size_t>{"gelu_grad_from_output", 0}));
  EXPECT_EQ(ran[7], (std::pair<std::string, size_t>{"fuse_elementwise", 1}));  // Relu + Add

  Options::global().set("disable_passes", " dead_code , fuse_elementwise");
  Graph h = chain();
  ran = optimize_graph(h, "test");
  ASSERT_EQ(ran.size(), 6u);
  EXPECT_EQ(ran[0].first, "identities");
  EXPECT_EQ(ran[1].first, "constant_folding");
  EXPECT_EQ(ran[2].first, "fold_transposes");
  EXPECT_EQ(ran[3].first, "fuse_softmax");
  EXPECT_EQ(ran[4].first, "fuse_layer_norm");
  EXPECT_EQ(count(h, "Exp"), 1u);

  Options::global().set("enable_compute_optimizer", "0");
  Graph off = chain();
  EXPECT_TRUE(optimize_graph(off, "test").empty());
  EXPECT_EQ(off.nodes().size(), chain().nodes().size());
}

// GELU as models spell it out: transformers' NewGELUActivation (x^3 as Pow), FastGELU (x * x,
// another grouping), and the erf form; the last argument changes one constant or lets another
// node read an inner value, so it is not GELU / not removable.
enum class GeluSpelling { kNew, kFast, kErf };
Graph spelled_gelu(GeluSpelling spelling, float cubic = 0.044715f, bool leak = false) {
  Graph g;
  g.name = "gelu";
  g.opset_imports[""] = 20;
  Value* in = g.add_input("x", {DType::kFloat32, SymShape{SymDim(2), SymDim(3)}});
  Value* bias = g.add_initializer(
      "bias", Tensor::from_vector<float>(DType::kFloat32, {3}, {0.1f, -0.2f, 0.3f}));
  Value* x = g.add_op("Add", {in, bias});  // a Linear's bias: x is its output, not the input
  auto c = [&](float v) {
    return g.add_initializer(g.unique_name("c"),
                             Tensor::from_vector<float>(DType::kFloat32, {}, {v}));
  };
  Value* y = nullptr;
  Value* inner = nullptr;
  if (spelling == GeluSpelling::kNew) {
    Value* half = g.add_op("Mul", {c(0.5f), x});
    Value* cube = g.add_op("Pow", {x, c(3.0f)});
    inner = g.add_op("Add", {x, g.add_op("Mul", {c(cubic), cube})});
    Value* t = g.add_op("Tanh", {g.add_op("Mul", {c(0.7978845608f), inner})});
    y = g.add_op("Mul", {half, g.add_op("Add", {c(1.0f), t})});
  } else if (spelling == GeluSpelling::kFast) {
    inner = g.add_op("Add", {c(1.0f), g.add_op("Mul", {g.add_op("Mul", {c(cubic), x}), x})});
    Value* t = g.add_op("Tanh", {g.add_op("Mul", {g.add_op("Mul", {x, c(0.7978845608f)}), inner})});
    y = g.add_op("Mul", {g.add_op("Mul", {c(0.5f), x}), g.add_op("Add", {t, c(1.0f)})});
  } else {
    inner = g.add_op("Div", {x, c(1.41421356f)});
    Value* e = g.add_op("Erf", {inner});
    y = g.add_op("Mul", {g.add_op("Mul", {x, c(0.5f)}), g.add_op("Add", {e, c(1.0f)})});
  }
  Node* out = g.add_node("Identity", {y}, {"y"});
  g.add_output(out->output(0));
  if (leak) g.add_output(inner);
  return g;
}

std::vector<float> run_gelu(Graph g) {
  Session s(std::move(g));
  Tensor x =
      Tensor::from_vector<float>(DType::kFloat32, {2, 3}, {-3.0f, -0.7f, -0.05f, 0.2f, 1.1f, 4.0f});
  Tensor y = s.run(std::vector<Tensor>{x})[0];
  return std::vector<float>(y.data<float>(), y.data<float>() + y.numel());
}

TEST_F(PassesTest, RecognizeGeluBecomesOneGeluWhateverTheSpelling) {
  for (GeluSpelling sp : {GeluSpelling::kNew, GeluSpelling::kFast, GeluSpelling::kErf}) {
    Graph g = spelled_gelu(sp);
    std::vector<float> before = run_gelu(clone_graph(g));
    ASSERT_EQ(recognize_gelu(g), 1u) << static_cast<int>(sp);
    ASSERT_EQ(count(g, "Gelu"), 1u);
    EXPECT_EQ(count(g, "Tanh") + count(g, "Erf") + count(g, "Mul"), 0u);
    EXPECT_EQ(count(g, "Add"), 1u);  // the bias add stays: Gelu reads its output
    for (Node* n : g.nodes())
      if (n->op_type == "Gelu") {
        EXPECT_EQ(n->attr_string("approximate", "none"),
                  sp == GeluSpelling::kErf ? "none" : "tanh");
        EXPECT_EQ(n->input(0)->producer()->op_type, "Add");
      }
    std::vector<float> after = run_gelu(std::move(g));
    ASSERT_EQ(after.size(), before.size());
    for (size_t i = 0; i < after.size(); ++i) EXPECT_NEAR(after[i], before[i], 2e-6f) << i;
  }
}

TEST_F(PassesTest, RecognizeGeluLeavesOtherFunctionsAndSharedValues) {
  Graph other = spelled_gelu(GeluSpelling::kNew, 0.05f);  // a different cubic coefficient
  EXPECT_EQ(recognize_gelu(other), 0u);
  EXPECT_EQ(count(other, "Gelu"), 0u);
  Graph shared = spelled_gelu(GeluSpelling::kFast, 0.044715f, true);  // an inner value is an output
  EXPECT_EQ(recognize_gelu(shared), 0u);
  EXPECT_EQ(count(shared, "Tanh"), 1u);
}

TEST_F(PassesTest, UnknownPassNameIsAnErrorListingThePasses) {
  Options::global().set("disable_passes", "identities,fuse_everything");
  Graph g = chain();
  try {
    optimize_graph(g, "test");
    FAIL() << "expected an OptionError";
  } catch (const OptionError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("GRAPHTRAIN_DISABLE_PASSES names 'fuse_everything'"), std::string::npos);
    EXPECT_NE(msg.find("the passes are: recognize_gelu, recognize_rms_norm, recognize_rotary, "
                       "recognize_silu_mul, fold_pad_into_conv, recognize_attention, "
                       "fuse_loss_gradient, "
                       "stash_gelu_derivative, identities, "
                       "constant_folding, dead_code, "
                       "fold_transposes, fuse_softmax, fuse_layer_norm, gelu_grad_from_output, "
                       "fuse_elementwise, "
                       "memory_plan"),
              std::string::npos);
  }
}

// ---- recognize_rms_norm ------------------------------------------------------------------------

enum class RmsSpelling { kLlama, kDivNoWeight, kPowWeightFirst };

// x [2, 5, 16] (and w [16]) -> RMSNorm written out in one of its spellings. With `other_reader`,
// the mean of squares is also a graph output.
Graph spelled_rms_norm(RmsSpelling sp, int64_t axis = -1, bool other_reader = false) {
  Graph g;
  g.name = "rms";
  g.opset_imports[""] = 18;
  g.opset_imports[GT] = 1;
  Value* x = g.add_input("x", {DType::kFloat32, SymShape{SymDim(2), SymDim(5), SymDim(16)}});
  Value* w = g.add_input("w", {DType::kFloat32, SymShape{SymDim(16)}});
  auto scalar_init = [&](float v) {
    return g.add_initializer(g.unique_name("c"),
                             Tensor::from_vector<float>(DType::kFloat32, {}, {v}));
  };
  Value* sq = sp == RmsSpelling::kDivNoWeight ? g.add_op("Mul", {x, x})
                                              : g.add_op("Pow", {x, scalar_init(2.0f)});
  Value* axes = g.add_initializer(
      "axes", Tensor::from_vector<int64_t>(DType::kInt64, {1}, std::vector<int64_t>{axis}));
  Value* ms = g.add_op("ReduceMean", {sq, axes}, {{"keepdims", Attribute::of(int64_t{1})}});
  Value* eps = scalar_init(1e-6f);
  Value* var =
      sp == RmsSpelling::kPowWeightFirst ? g.add_op("Add", {eps, ms}) : g.add_op("Add", {ms, eps});
  Value* y = nullptr;
  switch (sp) {
    case RmsSpelling::kLlama: {
      Value* r = g.add_op("Reciprocal", {g.add_op("Sqrt", {var})});
      y = g.add_op("Mul", {w, g.add_op("Mul", {x, r})});
      break;
    }
    case RmsSpelling::kDivNoWeight:
      y = g.add_op("Div", {x, g.add_op("Sqrt", {var})});
      break;
    case RmsSpelling::kPowWeightFirst: {
      Value* r = g.add_op("Pow", {var, scalar_init(-0.5f)});
      y = g.add_op("Mul", {g.add_op("Mul", {r, x}), w});
      break;
    }
  }
  g.add_output(g.add_op("Exp", {y}));
  if (other_reader) g.add_output(ms);
  infer_shapes(g);
  return g;
}

std::vector<float> run_rms(Graph g) {
  std::vector<float> xs(160), ws(16);
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = std::sin(0.37f * static_cast<float>(i)) * 2.0f;
  for (size_t i = 0; i < ws.size(); ++i) ws[i] = 0.5f + 0.1f * static_cast<float>(i);
  Session s(std::move(g));
  Tensor y = s.run(std::vector<Tensor>{Tensor::from_vector(DType::kFloat32, {2, 5, 16}, xs),
                                       Tensor::from_vector(DType::kFloat32, {16}, ws)})[0];
  return std::vector<float>(y.data<float>(), y.data<float>() + y.numel());
}

TEST_F(PassesTest, RecognizeRmsNormBecomesOneOpWhateverTheSpelling) {
  for (RmsSpelling sp :
       {RmsSpelling::kLlama, RmsSpelling::kDivNoWeight, RmsSpelling::kPowWeightFirst}) {
    Graph g = spelled_rms_norm(sp);
    std::vector<float> before = run_rms(clone_graph(g));
    ASSERT_EQ(recognize_rms_norm(g), 1u) << static_cast<int>(sp);
    EXPECT_EQ(count(g, "RMSNormalization"), 1u);
    EXPECT_EQ(g.num_nodes(), 2u);  // RMSNormalization and the Exp after it
    for (Node* n : g.nodes())
      if (n->op_type == "RMSNormalization") {
        EXPECT_EQ(n->input(0)->name(), "x");
        EXPECT_EQ(n->input(1)->name() == "w", sp != RmsSpelling::kDivNoWeight);  // else ones
        EXPECT_FLOAT_EQ(n->attr_float("epsilon", 0.0f), 1e-6f);
      }
    std::vector<float> after = run_rms(std::move(g));
    ASSERT_EQ(after.size(), before.size());
    for (size_t i = 0; i < after.size(); ++i)
      EXPECT_NEAR(after[i], before[i], 1e-5f * std::fabs(before[i])) << i;
  }
}

TEST_F(PassesTest, RecognizeRmsNormLeavesOtherAxesAndSharedValues) {
  Graph other_axis = spelled_rms_norm(RmsSpelling::kLlama, 1);
  EXPECT_EQ(recognize_rms_norm(other_axis), 0u);
  Graph shared = spelled_rms_norm(RmsSpelling::kLlama, -1, true);
  EXPECT_EQ(recognize_rms_norm(shared), 0u);
  EXPECT_EQ(count(shared, "ReduceMean"), 1u);
}

// ---- recognize_rotary --------------------------------------------------------------------------

// x [2, 3, 4, 8] -> cos * x + concat(-x[..., h:], x[..., :h]) * sin, Cos [1, 1, 4, 8] and Sin
// [4, 8] broadcast over the batch and heads (the products' operands in the other order than
// Llama's). h = 4 is transformers' rotate_half.
Graph spelled_rotary(int64_t h) {
  Graph g;
  g.name = "rotary";
  g.opset_imports[""] = 18;
  g.opset_imports[GT] = 1;
  Value* x =
      g.add_input("x", {DType::kFloat32, SymShape{SymDim(2), SymDim(3), SymDim(4), SymDim(8)}});
  Value* cos =
      g.add_input("cos", {DType::kFloat32, SymShape{SymDim(1), SymDim(1), SymDim(4), SymDim(8)}});
  Value* sin = g.add_input("sin", {DType::kFloat32, SymShape{SymDim(4), SymDim(8)}});
  auto ints = [&](std::vector<int64_t> v) {
    return g.add_initializer(g.unique_name("i"),
                             Tensor::from_vector<int64_t>(DType::kInt64, {int64_t(v.size())}, v));
  };
  Value* high = g.add_op("Slice", {x, ints({h}), ints({INT64_MAX}), ints({-1}), ints({1})});
  Value* low = g.add_op("Slice", {x, ints({0}), ints({h}), ints({3})});
  Value* rot =
      g.add_op("Concat", {g.add_op("Neg", {high}), low}, {{"axis", Attribute::of(int64_t{-1})}});
  Value* y = g.add_op("Add", {g.add_op("Mul", {rot, sin}), g.add_op("Mul", {cos, x})});
  g.add_output(g.add_op("Exp", {y}));
  infer_shapes(g);
  return g;
}

std::vector<Tensor> run_rotary(Graph g) {
  auto values = [](std::vector<int64_t> shape, float f) {
    int64_t n = shape_numel(shape);
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = std::sin(f * static_cast<float>(i));
    return Tensor::from_vector(DType::kFloat32, shape, v);
  };
  return Session(std::move(g))
      .run(std::vector<Tensor>{values({2, 3, 4, 8}, 0.37f), values({1, 1, 4, 8}, 0.21f),
                               values({4, 8}, 0.13f)});
}

TEST_F(PassesTest, RecognizeRotaryBecomesOneOp) {
  Graph g = spelled_rotary(4);
  std::vector<Tensor> before = run_rotary(clone_graph(g));
  ASSERT_EQ(recognize_rotary(g), 1u);
  EXPECT_EQ(count(g, "Rotary"), 1u);
  EXPECT_EQ(g.num_nodes(), 2u);  // Rotary and the Exp after it
  for (Node* n : g.nodes())
    if (n->op_type == "Rotary") {
      EXPECT_EQ(n->input(0)->name(), "x");
      EXPECT_EQ(n->input(1)->name(), "cos");
      EXPECT_EQ(n->input(2)->name(), "sin");
    }
  std::vector<Tensor> after = run_rotary(std::move(g));
  ASSERT_EQ(after[0].numel(), before[0].numel());
  for (int64_t i = 0; i < after[0].numel(); ++i)
    EXPECT_NEAR(after[0].data<float>()[i], before[0].data<float>()[i],
                1e-5f * std::fabs(before[0].data<float>()[i]))
        << i;
}

TEST_F(PassesTest, RecognizeRotaryLeavesOtherRotations) {
  Graph other = spelled_rotary(3);  // a rotation by 3, not by half
  EXPECT_EQ(recognize_rotary(other), 0u);
  EXPECT_EQ(count(other, "Neg"), 1u);
}

// ---- constant_folding and fuse_elementwise ------------------------------------------------------

Value* scalar(Graph& g, float v) {
  return g.add_initializer(g.unique_name("c"),
                           Tensor::from_vector<float>(DType::kFloat32, {}, {v}));
}

Graph new_graph(const std::string& name) {
  Graph g;
  g.name = name;
  g.opset_imports[""] = 18;
  g.opset_imports[GT] = 1;
  return g;
}

const SymShape kBTC = {SymDim::symbol("b"), SymDim(4), SymDim(6)};

// Every output of running `g` on inputs of the given shapes (deterministic values in [-2, 2]).
std::vector<std::vector<float>> run_all(Graph g, const std::vector<Shape>& shapes) {
  Session s(std::move(g));
  std::vector<Tensor> inputs;
  for (size_t i = 0; i < shapes.size(); ++i) {
    Tensor t = Tensor::empty(DType::kFloat32, shapes[i]);
    for (int64_t k = 0; k < t.numel(); ++k)
      t.data<float>()[k] =
          static_cast<float>(((k * 37 + static_cast<int64_t>(i) * 11) % 97)) / 24.0f - 2.0f;
    inputs.push_back(t);
  }
  std::vector<std::vector<float>> out;
  for (const Tensor& y : s.run(inputs)) {
    if (y.dtype() == DType::kBool)  // as 1s and 0s
      out.emplace_back(y.data<bool>(), y.data<bool>() + y.numel());
    else
      out.emplace_back(y.data<float>(), y.data<float>() + y.numel());
  }
  return out;
}

void expect_near(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b,
                 float tol) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t o = 0; o < a.size(); ++o) {
    ASSERT_EQ(a[o].size(), b[o].size());
    for (size_t i = 0; i < a[o].size(); ++i)
      if (a[o][i] != b[o][i] && !(std::isnan(a[o][i]) && std::isnan(b[o][i]))) {
        ASSERT_NEAR(a[o][i], b[o][i], tol * (1.0f + std::fabs(b[o][i])))
            << "output " << o << " element " << i;
      }
  }
}

// GPT-2's GELU with its bias: h = x + bias; y = 0.5 h (1 + tanh(sqrt(2/pi) (h + 0.044715 h^3))),
// with h also returned (a value the backward graph would read).
Graph bias_gelu() {
  Graph g = new_graph("bias_gelu");
  Value* x = g.add_input("x", {DType::kFloat32, kBTC});
  Value* bias = g.add_input("bias", {DType::kFloat32, SymShape{SymDim(6)}});
  Value* h = g.add_op("Add", {x, bias});
  Value* cube = g.add_op("Pow", {h, scalar(g, 3.0f)});
  Value* inner = g.add_op("Add", {h, g.add_op("Mul", {cube, scalar(g, 0.044715f)})});
  Value* t = g.add_op("Tanh", {g.add_op("Mul", {inner, scalar(g, 0.7978845608f)})});
  Value* y = g.add_op(
      "Mul", {g.add_op("Mul", {h, scalar(g, 0.5f)}), g.add_op("Add", {t, scalar(g, 1.0f)})});
  g.add_output(y);
  g.add_output(h);
  return g;
}

TEST_F(PassesTest, FuseElementwiseMakesOneLoopOfBiasAndGelu) {
  Graph g = bias_gelu();
  std::string y_name = g.outputs()[0]->name(), h_name = g.outputs()[1]->name();
  auto before = run_all(clone_graph(g), {{3, 4, 6}, {6}});
  EXPECT_EQ(fuse_elementwise(g), 1u);
  EXPECT_EQ(g.num_nodes(), 1u);
  Node* fused = g.nodes()[0];
  EXPECT_EQ(fused->qualified_op(), "graphtrain::FusedElementwise");
  EXPECT_EQ(fused->inputs().size(), 2u);  // x and the bias; the scalars are program constants
  // Both graph outputs are the fused node's, under their own names.
  ASSERT_EQ(g.outputs().size(), 2u);
  EXPECT_EQ(g.outputs()[0]->producer(), fused);
  EXPECT_EQ(g.outputs()[1]->producer(), fused);
  EXPECT_EQ(g.outputs()[0]->name(), y_name);
  EXPECT_EQ(g.outputs()[1]->name(), h_name);
  expect_near(run_all(std::move(g), {{3, 4, 6}, {6}}), before, 1e-6f);
}

// A bias add and the erf GELU (a Linear layer's activation): the program runs them as one pass
// over the data (vec_add_apply), which must write both the sum, an output here, and the GELU, with
// the same values as the two kernels: widths with a 16-lane tail, and one over a block (512).
// GeluGrad(dY, X) whose GELU output is at hand reads it (Phi = Y / X): in one graph, the Gelu of
// X (both forms, widths with a 16-lane tail); a backward graph's input of that name; not a value
// of another shape, nor a name that is missing.
TEST_F(PassesTest, GeluGradFromOutputReadsTheGeluOutput) {
  for (const std::string approximate : {"none", "tanh"})
    for (int64_t c : {37, 16}) {
      Graph g = new_graph("gelu_grad");
      SymShape shape = {SymDim::symbol("b"), SymDim(3), SymDim(c)};
      Value* dy = g.add_input("dy", {DType::kFloat32, shape});
      Value* x = g.add_input("x", {DType::kFloat32, shape});
      std::map<std::string, Attribute> attrs = {{"approximate", Attribute::of(approximate)}};
      Value* y = g.add_op("Gelu", {x}, attrs);
      attrs["forward_output"] = Attribute::of(y->name());
      g.add_output(g.add_op("GeluGrad", {dy, x}, attrs, GT));
      g.add_output(y);
      auto before = run_all(clone_graph(g), {{2, 3, c}, {2, 3, c}});
      EXPECT_EQ(gelu_grad_from_output(g), 1u);
      Node* grad = g.outputs()[0]->producer();
      ASSERT_EQ(grad->inputs().size(), 3u);
      EXPECT_EQ(grad->input(2), y);
      SCOPED_TRACE(approximate + " " + std::to_string(c));
      expect_near(run_all(std::move(g), {{2, 3, c}, {2, 3, c}}), before, 2e-6f);
    }
  Graph g = new_graph("backward");
  Value* dy = g.add_input("dy", {DType::kFloat32, kBTC});
  Value* x = g.add_input("x", {DType::kFloat32, kBTC});
  Value* y = g.add_input("gelu_7", {DType::kFloat32, kBTC});
  g.add_input("other", {DType::kFloat32, SymShape{SymDim(4), SymDim(6)}});
  for (const char* name : {"gelu_7", "other", "missing"})
    g.add_output(
        g.add_op("GeluGrad", {dy, x}, {{"forward_output", Attribute::of(std::string(name))}}, GT));
  EXPECT_EQ(gelu_grad_from_output(g), 1u);
  EXPECT_EQ(g.outputs()[0]->producer()->input(2), y);
  EXPECT_EQ(g.outputs()[1]->producer()->inputs().size(), 2u);
  EXPECT_EQ(g.outputs()[2]->producer()->inputs().size(), 2u);
}

// A backward graph that reads a view of the GELU output (transformers' Conv1D flattens it before
// its addmm and stashes the view): GeluGrad reads it back in X's shape through a Reshape, with the
// values of the two-input form; not a view of another element count.
TEST_F(PassesTest, GeluGradFromOutputReadsAStashedView) {
  const int64_t c = 37;
  SymShape shape = {SymDim::symbol("b"), SymDim(3), SymDim(c)};
  SymShape flat = {SymDim::symbol("b") * SymDim(3), SymDim(c)};
  Graph g = new_graph("backward");
  g.add_input("dy", {DType::kFloat32, shape});
  Value* x = g.add_input("x", {DType::kFloat32, shape});
  Value* view = g.add_input("flat_9", {DType::kFloat32, flat});
  g.add_input("other_view", {DType::kFloat32, SymShape{SymDim(4), SymDim(c)}});
  for (const char* name : {"flat_9", "other_view"}) {
    Node* grad = g.add_node("GeluGrad", {g.inputs()[0], x}, {g.unique_name("dx")}, GT, "grad");
    grad->attributes = {
        {"forward_output", Attribute::of(std::string("gelu_3"))},
        {"forward_output_views", Attribute::of(std::vector<std::string>{"missing", name})}};
    grad->scope = "mlp";
    g.add_output(grad->output(0));
  }
  // Inputs: dY and X as run_all makes them, the view holding GELU(X) flattened.
  Shape bx = {2, 3, c};
  Tensor dy = Tensor::empty(DType::kFloat32, bx), xt = Tensor::empty(DType::kFloat32, bx);
  for (int64_t k = 0; k < xt.numel(); ++k) {
    dy.data<float>()[k] = static_cast<float>((k * 37 % 97)) / 24.0f - 2.0f;
    xt.data<float>()[k] = static_cast<float>(((k * 37 + 11) % 97)) / 24.0f - 2.0f;
  }
  Graph gelu = new_graph("gelu");
  gelu.add_output(gelu.add_op("Gelu", {gelu.add_input("x", {DType::kFloat32, shape})}));
  Tensor y = Session(std::move(gelu)).run({xt})[0].view({6, c});
  Tensor other = Tensor::empty(DType::kFloat32, {4, c});
  auto run = [&](Graph graph) { return Session(std::move(graph)).run({dy, xt, y, other}); };
  std::vector<Tensor> before = run(clone_graph(g));

  EXPECT_EQ(gelu_grad_from_output(g), 1u);
  Node* grad = g.outputs()[0]->producer();
  ASSERT_EQ(grad->inputs().size(), 3u);
  Node* reshape = grad->input(2)->producer();
  ASSERT_NE(reshape, nullptr);
  EXPECT_EQ(reshape->op_type, "Reshape");
  EXPECT_EQ(reshape->input(0), view);
  EXPECT_EQ(reshape->input(1)->producer()->op_type, "Shape");
  EXPECT_EQ(reshape->scope, "mlp");
  EXPECT_EQ(g.outputs()[1]->producer()->inputs().size(), 2u);  // 4 rows: another count
  std::vector<Tensor> after = run(std::move(g));
  for (size_t o = 0; o < 2; ++o)
    for (int64_t k = 0; k < after[o].numel(); ++k)
      EXPECT_NEAR(after[o].data<float>()[k], before[o].data<float>()[k],
                  2e-6f * (1.0f + std::fabs(before[o].data<float>()[k])))
          << "output " << o << " element " << k;
}

TEST_F(PassesTest, FusedBiasGeluMatchesItsKernelsBitForBit) {
  for (int64_t c : {37, 600, 16}) {
    Graph g = new_graph("bias_gelu_erf");
    Value* x =
        g.add_input("x", {DType::kFloat32, SymShape{SymDim::symbol("b"), SymDim(3), SymDim(c)}});
    Value* bias = g.add_input("bias", {DType::kFloat32, SymShape{SymDim(c)}});
    Value* h = g.add_op("Add", {x, bias});
    g.add_output(g.add_op("Gelu", {h}));
    g.add_output(h);
    auto before = run_all(clone_graph(g), {{2, 3, c}, {c}});
    EXPECT_EQ(fuse_elementwise(g), 1u);
    EXPECT_EQ(g.num_nodes(), 1u);
    SCOPED_TRACE(c);
    expect_near(run_all(std::move(g), {{2, 3, c}, {c}}), before, 0.0f);
  }
}

TEST_F(PassesTest, FuseElementwiseKeepsScopesAndNamesOfOutputs) {
  Graph g = new_graph("scoped");
  Value* x = g.add_input("x", {DType::kFloat32, kBTC});
  Value* a = g.add_op("Exp", {x});
  a->producer()->scope = "model.block.0.mlp.fc";
  Value* b = g.add_op("Neg", {a});
  b->producer()->scope = "model.block.0.mlp.act";
  std::string name = b->name();
  g.add_output(b);
  EXPECT_EQ(fuse_elementwise(g), 1u);
  EXPECT_EQ(g.outputs()[0]->name(), name);
  EXPECT_EQ(g.outputs()[0]->producer()->scope, "model.block.0.mlp");
}

TEST_F(PassesTest, FuseElementwiseMakesNoCycle) {
  // e = Exp(x); s = Softmax(e) (not fusible, reads e); y = e * s. Fusing Mul into Exp's group
  // would make the fused node both feed Softmax and read it.
  Graph g = new_graph("cycle");
  Value* x = g.add_input("x", {DType::kFloat32, kBTC});
  Value* e = g.add_op("Exp", {x});
  Value* s = g.add_op("Softmax", {e}, {{"axis", Attribute::of(int64_t{-1})}});
  Value* y = g.add_op("Neg", {g.add_op("Mul", {e, s})});
  g.add_output(y);
  auto before = run_all(clone_graph(g), {{2, 4, 6}});
  EXPECT_EQ(fuse_elementwise(g), 1u);  // Mul and Neg; Exp stays alone
  EXPECT_EQ(count(g, "Exp"), 1u);
  EXPECT_EQ(count(g, "FusedElementwise"), 1u);
  g.topological_order();  // throws on a cycle
  expect_near(run_all(std::move(g), {{2, 4, 6}}), before, 1e-6f);
}

TEST_F(PassesTest, FuseElementwiseOnlyJoinsValuesOfOneShape) {
  // A [b, 4, 1] scale broadcast into [b, 4, 6]: the scale's own chain is a different shape.
  Graph g = new_graph("shapes");
  Value* x = g.add_input("x", {DType::kFloat32, kBTC});
  Value* s =
      g.add_input("s", {DType::kFloat32, SymShape{SymDim::symbol("b"), SymDim(4), SymDim(1)}});
  Value* s2 = g.add_op("Sqrt", {g.add_op("Abs", {s})});
  g.add_output(g.add_op("Relu", {g.add_op("Mul", {x, s2})}));
  auto before = run_all(clone_graph(g), {{2, 4, 6}, {2, 4, 1}});
  EXPECT_EQ(fuse_elementwise(g), 2u);
  expect_near(run_all(std::move(g), {{2, 4, 6}, {2, 4, 1}}), before, 1e-6f);
}

// Every op a program can hold computes what its own kernel computes (op -> Neg, fused and not).
TEST_F(PassesTest, EveryFusibleOpMatchesItsKernel) {
  struct Case {
    std::string op, domain;
    int inputs;
    std::map<std::string, Attribute> attrs;
  };
  std::vector<Case> cases = {
      {"Add", "", 2, {}},
      {"Sub", "", 2, {}},
      {"Mul", "", 2, {}},
      {"Div", "", 2, {}},
      {"Max", "", 2, {}},
      {"Min", "", 2, {}},
      {"Neg", "", 1, {}},
      {"Abs", "", 1, {}},
      {"Sqrt", "", 1, {}},
      {"Reciprocal", "", 1, {}},
      {"Exp", "", 1, {}},
      {"Log", "", 1, {}},
      {"Tanh", "", 1, {}},
      {"Erf", "", 1, {}},
      {"Sigmoid", "", 1, {}},
      {"Relu", "", 1, {}},
      {"Sin", "", 1, {}},
      {"Cos", "", 1, {}},
      {"LeakyRelu", "", 1, {{"alpha", Attribute::of(0.2f)}}},
      {"Gelu", "", 1, {}},
      {"Gelu", "", 1, {{"approximate", Attribute::of(std::string("tanh"))}}},
      {"ReluGrad", GT, 2, {}},
      {"SigmoidGrad", GT, 2, {}},
      {"TanhGrad", GT, 2, {}},
      {"GeluGrad", GT, 2, {}},
      {"GeluGrad", GT, 2, {{"approximate", Attribute::of(std::string("tanh"))}}},
      {"LeakyReluGrad", GT, 2, {{"alpha", Attribute::of(0.3f)}}},
  };
  for (const Case& c : cases) {
    Graph g = new_graph(c.op);
    Value* x = g.add_input("x", {DType::kFloat32, kBTC});
    Value* y = g.add_input("y", {DType::kFloat32, kBTC});
    std::vector<Value*> ins = {x};
    if (c.inputs == 2) ins.push_back(y);
    bool positive = c.op == "Sqrt" || c.op == "Log";
    if (positive) ins[0] = g.add_op("Exp", {x});
    Value* v = g.add_op(c.op, ins, c.attrs, c.domain);
    g.add_output(g.add_op("Neg", {v}));
    auto before = run_all(clone_graph(g), {{2, 4, 6}, {2, 4, 6}});
    EXPECT_EQ(fuse_elementwise(g), 1u) << c.op;
    EXPECT_EQ(g.num_nodes(), 1u) << c.op;
    SCOPED_TRACE(c.op);
    expect_near(run_all(std::move(g), {{2, 4, 6}, {2, 4, 6}}), before, 1e-6f);
  }
  // Pow with each exponent the program specializes, and a general one.
  for (float p : {2.0f, 3.0f, 0.5f, -1.0f, 1.7f}) {
    Graph g = new_graph("pow");
    Value* x = g.add_input("x", {DType::kFloat32, kBTC});
    Value* v = g.add_op("Pow", {g.add_op("Exp", {x}), scalar(g, p)});
    g.add_output(g.add_op("Neg", {v}));
    auto before = run_all(clone_graph(g), {{2, 4, 6}});
    EXPECT_EQ(fuse_elementwise(g), 1u);
    SCOPED_TRACE(p);
    expect_near(run_all(std::move(g), {{2, 4, 6}}), before, 1e-6f);
  }
}

// Comparisons, logic, Where and Clip join a program: hardtanh as the ATen translation writes it
// (Where(x strictly inside, x, Clip(x))) and a select by a bool mask made outside the group (read
// as 1s and 0s); a comparison that something outside reads stays a bool output.
TEST_F(PassesTest, FuseElementwiseTakesComparisonsAndWhere) {
  Graph g = new_graph("select");
  Value* x = g.add_input("x", {DType::kFloat32, kBTC});
  Value* y = g.add_input("y", {DType::kFloat32, kBTC});
  Value* lo = scalar(g, -1.0f);
  Value* hi = scalar(g, 1.0f);
  Value* inside = g.add_op("And", {g.add_op("Greater", {x, lo}), g.add_op("Less", {x, hi})});
  Value* h = g.add_op("Where", {inside, x, g.add_op("Clip", {x, lo, hi})});
  Value* mask = g.add_op("Cast", {y}, {{"to", Attribute::of(int64_t{9})}});  // bool: y != 0
  Value* low = g.add_op("Min", {x, y});  // equal to x where x <= y: the comparisons' ties
  Value* either = g.add_op("Or", {g.add_op("LessOrEqual", {x, low}), g.add_op("Not", {mask})});
  Value* pick = g.add_op("Where", {either, h, g.add_op("Mul", {y, scalar(g, 2.0f)})});
  g.add_output(pick);
  g.add_output(inside);
  g.add_output(g.add_op("Where", {g.add_op("Equal", {h, scalar(g, 0.5f)}), y, x}));
  g.add_output(g.add_op("GreaterOrEqual", {x, low}));
  // The inputs hold -1, 1 and 0.5 (the bounds and Equal's constant) in x and a 0 in y.
  std::vector<Shape> shapes = {{2, 4, 6}, {2, 4, 6}};
  auto before = run_all(clone_graph(g), shapes);
  EXPECT_EQ(fuse_elementwise(g), 1u);
  EXPECT_EQ(count(g, "Cast"), 1u);  // the mask's maker stays; everything else is one node
  EXPECT_EQ(g.num_nodes(), 2u);
  Node* fused = g.outputs()[0]->producer();
  ASSERT_EQ(fused->qualified_op(), "graphtrain::FusedElementwise");
  infer_shapes(g);
  EXPECT_EQ(g.outputs()[0]->type.dtype, DType::kFloat32);
  EXPECT_EQ(g.outputs()[1]->type.dtype, DType::kBool);
  EXPECT_EQ(g.outputs()[3]->type.dtype, DType::kBool);
  auto after = run_all(std::move(g), shapes);
  ASSERT_EQ(after.size(), before.size());
  for (size_t o = 0; o < after.size(); ++o) EXPECT_EQ(after[o], before[o]) << "output " << o;
}

TEST_F(PassesTest, ConstantFoldingComputesSmallConstantNodes) {
  // Pow's gradient: dx = dy * 3 * x^(3 - 1), the exponent computed by a Sub of constants.
  Graph g = new_graph("fold");
  Value* x = g.add_input("x", {DType::kFloat32, kBTC});
  Value* p = g.add_op("Sub", {scalar(g, 3.0f), scalar(g, 1.0f)});
  Value* y = g.add_op("Mul", {g.add_op("Pow", {x, p}), scalar(g, 3.0f)});
  g.add_output(y);
  auto before = run_all(clone_graph(g), {{2, 4, 6}});
  EXPECT_EQ(fold_constants(g), 1u);
  EXPECT_EQ(count(g, "Sub"), 0u);
  Value* folded = g.nodes()[0]->op_type == "Pow" ? g.nodes()[0]->input(1) : nullptr;
  ASSERT_TRUE(folded && folded->is_initializer());
  EXPECT_EQ(folded->initializer.data<float>()[0], 2.0f);
  EXPECT_EQ(fuse_elementwise(g), 1u);  // now Pow's exponent is a constant
  expect_near(run_all(std::move(g), {{2, 4, 6}}), before, 1e-6f);
}

// q @ k^T as attention writes it: MatMul(q, Transpose(k, perm 0 2 1)); and a transposed A.
TEST_F(PassesTest, FoldTransposesIntoTheGemm) {
  Graph g = new_graph("qk");
  SymShape bkd = {SymDim::symbol("b"), SymDim(5), SymDim(4)};
  Value* q = g.add_input("q", {DType::kFloat32, bkd});
  Value* k = g.add_input("k", {DType::kFloat32, bkd});
  Value* kt = g.add_op("Transpose", {k}, {{"perm", Attribute::of(std::vector<int64_t>{0, 2, 1})}});
  Value* scores = g.add_op("MatMul", {q, kt});  // [b, 5, 5]
  Value* qt = g.add_op("Transpose", {q}, {{"perm", Attribute::of(std::vector<int64_t>{0, 2, 1})}});
  Value* gram = g.add_op("MatMul", {qt, k});  // [b, 4, 4]
  g.add_output(scores);
  g.add_output(gram);
  auto before = run_all(clone_graph(g), {{3, 5, 4}, {3, 5, 4}});
  EXPECT_EQ(fold_transposes(g), 2u);
  EXPECT_EQ(count(g, "Transpose"), 0u);
  EXPECT_EQ(count(g, "FusedMatMul"), 2u);
  EXPECT_EQ(scores->producer()->attr_int("transB", 0), 1);
  EXPECT_EQ(gram->producer()->attr_int("transA", 0), 1);
  expect_near(run_all(std::move(g), {{3, 5, 4}, {3, 5, 4}}), before, 1e-6f);
}

TEST_F(PassesTest, FoldTransposesLeavesSharedTransposesAndUnstridableOnes) {
  Graph g = new_graph("keep");
  Value* x = g.add_input("x", {DType::kFloat32, SymShape{SymDim(2), SymDim(3), SymDim(4)}});
  Value* w = g.add_input("w", {DType::kFloat32, SymShape{SymDim(2), SymDim(4)}});
  // Swaps the leading (batch) dims: read through strides (permA).
  Value* lead =
      g.add_op("Transpose", {x}, {{"perm", Attribute::of(std::vector<int64_t>{1, 0, 2})}});
  Value* y = g.add_op("MatMul", {lead, g.add_op("Transpose", {w})});  // B: transB (rank 2)
  g.add_output(y);
  // Read by two nodes (and a graph output): it stays.
  Value* shared =
      g.add_op("Transpose", {x}, {{"perm", Attribute::of(std::vector<int64_t>{0, 2, 1})}});
  g.add_output(g.add_op("MatMul", {shared, x}));
  g.add_output(shared);
  // Moves the stored last dim to the front: no matrix dim has stride 1, it stays.
  Value* front =
      g.add_op("Transpose", {x}, {{"perm", Attribute::of(std::vector<int64_t>{2, 0, 1})}});
  Value* v = g.add_input("v", {DType::kFloat32, SymShape{SymDim(3), SymDim(5)}});
  g.add_output(g.add_op("MatMul", {front, v}));
  auto before = run_all(clone_graph(g), {{2, 3, 4}, {2, 4}, {3, 5}});
  EXPECT_EQ(fold_transposes(g), 2u);
  EXPECT_EQ(count(g, "Transpose"), 2u);
  EXPECT_EQ(y->producer()->attr_ints("permA"), (std::vector<int64_t>{1, 0, 2}));
  expect_near(run_all(std::move(g), {{2, 3, 4}, {2, 4}, {3, 5}}), before, 1e-6f);
}

// Attention as a GPT writes it: heads split out of [b, t, h, d] by Transpose(0, 2, 1, 3), scores,
// the weighted values merged back by the inverse Transpose. All four Transposes fold (permA,
// permB with transB, and permY on the output), and the result is the same.
TEST_F(PassesTest, FoldTransposesOfAttentionHeadsIntoStridedGemms) {
  Graph g = new_graph("heads");
  SymShape bthd = {SymDim::symbol("b"), SymDim(6), SymDim(2), SymDim(4)};
  Value* q = g.add_input("q", {DType::kFloat32, bthd});
  Value* k = g.add_input("k", {DType::kFloat32, bthd});
  Value* v = g.add_input("v", {DType::kFloat32, bthd});
  auto heads = [&](Value* x) {
    return g.add_op("Transpose", {x}, {{"perm", Attribute::of(std::vector<int64_t>{0, 2, 1, 3})}});
  };
  Value* kt = g.add_op("Transpose", {heads(k)},
                       {{"perm", Attribute::of(std::vector<int64_t>{0, 1, 3, 2})}});
  Value* scores = g.add_op("MatMul", {heads(q), kt});  // [b, h, t, t]
  Value* p = g.add_op("Softmax", {scores}, {{"axis", Attribute::of(int64_t{-1})}});
  Value* o = g.add_op("MatMul", {p, heads(v)});  // [b, h, t, d]
  Value* merged =
      g.add_op("Transpose", {o}, {{"perm", Attribute::of(std::vector<int64_t>{0, 2, 1, 3})}});
  g.add_output(merged);
  auto before = run_all(clone_graph(g), {{3, 6, 2, 4}, {3, 6, 2, 4}, {3, 6, 2, 4}});
  size_t folds = fold_transposes(g);
  EXPECT_GE(folds, 4u);
  EXPECT_EQ(count(g, "Transpose"), 0u);
  EXPECT_EQ(count(g, "FusedMatMul"), 2u);
  expect_near(run_all(std::move(g), {{3, 6, 2, 4}, {3, 6, 2, 4}, {3, 6, 2, 4}}), before, 1e-5f);
}

// The backward of attention as the gradient builder writes it: dK^T = (dS^T Q)^T transposed back
// into [b, t, h, d] (a swapped product, then permY), k split into heads read by two GEMMs (both
// fold it), and, forward, k split into heads and transposed (two Transposes in a row become one;
// it stays, being a graph output: a value stashed for the backward).
TEST_F(PassesTest, FoldTransposesOfSwappedProductsSharedOperandsAndChains) {
  Graph g = new_graph("attention_grad");
  SymShape bthd = {SymDim::symbol("b"), SymDim(6), SymDim(2), SymDim(4)};
  SymShape bhtt = {SymDim::symbol("b"), SymDim(2), SymDim(6), SymDim(6)};
  Value* ds = g.add_input("ds", {DType::kFloat32, bhtt});
  Value* q = g.add_input(
      "q", {DType::kFloat32, SymShape{SymDim::symbol("b"), SymDim(2), SymDim(6), SymDim(4)}});
  Value* k = g.add_input("k", {DType::kFloat32, bthd});
  auto perm = [](std::vector<int64_t> p) { return Attribute::of(std::move(p)); };
  Value* dk_t = g.add_op(
      "Transpose",
      {g.add_op("MatMul", {g.add_op("Transpose", {ds}, {{"perm", perm({0, 1, 3, 2})}}), q})},
      {{"perm", perm({0, 1, 3, 2})}});
  g.add_output(g.add_op("Transpose", {dk_t}, {{"perm", perm({0, 2, 1, 3})}}));
  Value* kh = g.add_op("Transpose", {k}, {{"perm", perm({0, 2, 1, 3})}});  // [b, h, t, d]
  g.add_output(g.add_op("MatMul", {ds, kh}));
  g.add_output(
      g.add_op("MatMul", {g.add_op("Transpose", {ds}, {{"perm", perm({0, 1, 3, 2})}}), kh}));
  Value* kt = g.add_op("Transpose", {g.add_op("Transpose", {k}, {{"perm", perm({0, 2, 1, 3})}})},
                       {{"perm", perm({0, 1, 3, 2})}});
  g.add_output(kt);
  g.add_output(g.add_op("MatMul", {q, kt}));
  std::vector<Shape> shapes = {{3, 2, 6, 6}, {3, 2, 6, 4}, {3, 6, 2, 4}};
  auto before = run_all(clone_graph(g), shapes);
  fold_transposes(g);
  EXPECT_EQ(count(g, "Transpose"), 1u);  // the stashed kt, made in one copy
  EXPECT_EQ(kt->producer()->attr_ints("perm"), (std::vector<int64_t>{0, 2, 3, 1}));
  EXPECT_EQ(kt->producer()->input(0), k);
  EXPECT_EQ(g.outputs()[0]->producer()->op_type, "FusedMatMul");
  expect_near(run_all(std::move(g), shapes), before, 1e-5f);
}

// ---- fuse_softmax ------------------------------------------------------------------------------

// softmax(scores / c + mask) for a causal-style mask [t, t] (with -inf) and a padding-style one
// [b, 1, 1, t], c on the Div's right or a Mul on either side; plus the scaled gradient.
TEST_F(PassesTest, FuseSoftmaxOfScaledMaskedScoresAndItsGradient) {
  SymShape bhtt = {SymDim::symbol("b"), SymDim(2), SymDim(5), SymDim(5)};
  Graph g = new_graph("attention_scores");
  Value* scores = g.add_input("scores", {DType::kFloat32, bhtt});
  Value* causal = g.add_input("causal", {DType::kFloat32, SymShape{SymDim(5), SymDim(5)}});
  Value* pad = g.add_input(
      "pad", {DType::kFloat32, SymShape{SymDim::symbol("b"), SymDim(1), SymDim(1), SymDim(5)}});
  Value* dy = g.add_input("dy", {DType::kFloat32, bhtt});
  auto softmax = [&](Value* x) {
    return g.add_op("Softmax", {x}, {{"axis", Attribute::of(int64_t{-1})}});
  };
  Value* c = scalar(g, 2.5f);
  Value* p1 = softmax(g.add_op("Add", {g.add_op("Div", {scores, c}), causal}));
  Value* p2 = softmax(g.add_op("Add", {pad, g.add_op("Mul", {c, scores})}));
  Value* p3 = softmax(g.add_op("Mul", {scores, c}));
  Value* p4 = softmax(g.add_op("Add", {scores, pad}));
  Value* keep = g.add_op("Add", {g.add_op("Div", {scores, c}), causal});  // read twice: stays
  Value* p5 = softmax(keep);
  Value* grad = g.add_op("SoftmaxGrad", {dy, p1}, {{"axis", Attribute::of(int64_t{-1})}}, GT);
  for (Value* v : {p1, p2, p3, p4, p5, keep, g.add_op("Div", {grad, c})}) g.add_output(v);
  std::vector<Shape> shapes = {{3, 2, 5, 5}, {5, 5}, {3, 1, 1, 5}, {3, 2, 5, 5}};
  // A causal mask: -inf above the diagonal.
  auto run_masked = [&](Graph graph) {
    Session s(std::move(graph));
    std::vector<Tensor> in;
    for (size_t i = 0; i < shapes.size(); ++i) {
      Tensor t = Tensor::empty(DType::kFloat32, shapes[i]);
      for (int64_t k = 0; k < t.numel(); ++k)
        t.data<float>()[k] = std::sin(0.7f * static_cast<float>(k) + static_cast<float>(i));
      in.push_back(t);
    }
    for (int64_t r = 0; r < 5; ++r)
      for (int64_t q = r + 1; q < 5; ++q) in[1].data<float>()[r * 5 + q] = -INFINITY;
    std::vector<std::vector<float>> out;
    for (const Tensor& y : s.run(in))
      out.emplace_back(y.data<float>(), y.data<float>() + y.numel());
    return out;
  };
  auto before = run_masked(clone_graph(g));
  EXPECT_EQ(fuse_softmax(g), 5u);  // four forward, one gradient
  EXPECT_EQ(count(g, "FusedSoftmax"), 4u);
  EXPECT_EQ(count(g, "Softmax"), 1u);  // its input is read elsewhere too
  EXPECT_EQ(count(g, "Mul"), 0u);
  EXPECT_EQ(count(g, "Div"), 1u);  // the shared one
  EXPECT_EQ(count(g, "SoftmaxGrad"), 1u);
  expect_near(run_masked(std::move(g)), before, 1e-5f);
}

TEST_F(PassesTest, FuseSoftmaxLeavesOtherAxesAndWideningMasks) {
  Graph g = new_graph("other_softmax");
  Value* x = g.add_input("x", {DType::kFloat32, kBTC});
  Value* wide = g.add_input(
      "wide", {DType::kFloat32, SymShape{SymDim(2), SymDim::symbol("b"), SymDim(4), SymDim(6)}});
  g.add_output(g.add_op("Softmax", {g.add_op("Mul", {x, scalar(g, 3.0f)})},
                        {{"axis", Attribute::of(int64_t{1})}}));
  g.add_output(g.add_op("Softmax", {g.add_op("Add", {x, wide})}));
  Value* v = g.add_input("v", {DType::kFloat32, kBTC});
  g.add_output(g.add_op("Softmax", {g.add_op("Mul", {x, v})}));  // not a constant scale
  EXPECT_EQ(fuse_softmax(g), 0u);
}

// ---- recognize_attention -----------------------------------------------------------------------

Value* transposed(Graph& g, Value* x, std::vector<int64_t> perm) {
  return g.add_op("Transpose", {x}, {{"perm", Attribute::of(std::move(perm))}});
}

// Inputs xq, xk, xv of [b, 5, 2, 4]: q, k and v before their heads are transposed out.
std::vector<Value*> qkv_inputs(Graph& g) {
  SymShape bthd = {SymDim::symbol("b"), SymDim(5), SymDim(2), SymDim(4)};
  std::vector<Value*> in;
  for (const char* name : {"xq", "xk", "xv"})
    in.push_back(g.add_input(name, {DType::kFloat32, bthd}));
  return in;
}

Node* only(const Graph& g, const std::string& op) {
  Node* found = nullptr;
  for (Node* n : g.nodes())
    if (n->op_type == op) {
      EXPECT_EQ(found, nullptr) << "more than one " << op;
      found = n;
    }
  return found;
}

// softmax(q k^T / 2 + mask) v with the heads transposed out of [b, t, h, d] and back: one
// Attention reading and writing [b, t, h, d]. The same product whose probabilities are also
// returned stays written out.
TEST_F(PassesTest, RecognizeAttentionWrittenOutWithTheHeadsInPlace) {
  Graph g = new_graph("attention");
  std::vector<Value*> in = qkv_inputs(g);
  Value *xq = in[0], *xk = in[1], *xv = in[2];
  Value* mask = g.add_input("mask", {DType::kFloat32, SymShape{SymDim(5), SymDim(5)}});
  Value* q = transposed(g, xq, {0, 2, 1, 3});
  Value* k = transposed(g, xk, {0, 2, 1, 3});
  Value* v = transposed(g, xv, {0, 2, 1, 3});
  auto softmax = [&](Value* x) {
    return g.add_op("Softmax", {x}, {{"axis", Attribute::of(int64_t{-1})}});
  };
  Value* s = g.add_op("MatMul", {q, transposed(g, k, {0, 1, 3, 2})});
  Value* p = softmax(g.add_op("Add", {g.add_op("Div", {s, scalar(g, 2.0f)}), mask}));
  g.add_output(transposed(g, g.add_op("MatMul", {p, v}), {0, 2, 1, 3}));
  Value* s2 = g.add_op("MatMul", {q, transposed(g, k, {0, 1, 3, 2})});
  Value* p2 = softmax(g.add_op("Mul", {scalar(g, 0.5f), s2}));
  g.add_output(g.add_op("MatMul", {p2, v}));
  g.add_output(p2);  // read outside the product: not fused
  std::vector<Shape> shapes = {{3, 5, 2, 4}, {3, 5, 2, 4}, {3, 5, 2, 4}, {5, 5}};
  auto before = run_all(clone_graph(g), shapes);
  EXPECT_EQ(recognize_attention(g), 2u);  // fused, then the heads folded
  Node* att = only(g, "Attention");
  ASSERT_NE(att, nullptr);
  EXPECT_EQ(att->inputs(), (std::vector<Value*>{xq, xk, xv, mask}));
  EXPECT_EQ(att->attr_int("heads_inside", 0), 1);
  EXPECT_FLOAT_EQ(att->attr_float("scale", 0.0f), 0.5f);
  EXPECT_EQ(g.outputs()[0]->producer(), att);
  EXPECT_EQ(count(g, "Softmax"), 1u);
  EXPECT_EQ(count(g, "MatMul"), 2u);
  EXPECT_EQ(count(g, "Transpose"), 4u);  // the second product's q, k, k^T and v
  expect_near(run_all(std::move(g), shapes), before, 1e-5f);
}

// A mask computed from constants that hides nothing (transformers' bidirectional mask under
// torch.export: a comparison over a Range, expanded to the batch; or zeros added) is dropped, and
// one that hides exactly the keys after each query becomes causal=1; other masks stay.
TEST_F(PassesTest, RecognizeAttentionDropsConstantOpenAndCausalMasks) {
  SymShape bhtd = {SymDim::symbol("b"), SymDim(2), SymDim(5), SymDim(4)};
  Graph g = new_graph("constant_masks");
  Value* q = g.add_input("q", {DType::kFloat32, bhtd});
  Value* k = g.add_input("k", {DType::kFloat32, bhtd});
  Value* v = g.add_input("v", {DType::kFloat32, bhtd});
  auto ints = [&](std::vector<int64_t> x) {
    return g.add_initializer(g.unique_name("i"),
                             Tensor::from_vector<int64_t>(DType::kInt64, {int64_t(x.size())}, x));
  };
  auto i64 = [&](int64_t x) {
    return g.add_initializer(g.unique_name("s"),
                             Tensor::from_vector<int64_t>(DType::kInt64, {}, {x}));
  };
  // [b, 1, 5, 5]: the batch from q's shape at run time, the rest constant.
  Value* batch_shape = g.add_op(
      "Concat", {g.add_op("Shape", {q}, {{"end", Attribute::of(int64_t{1})}}), ints({1, 5, 5})},
      {{"axis", Attribute::of(int64_t{0})}});
  Value* range = g.add_op("Range", {i64(0), i64(5), i64(1)});
  Value* keys = g.add_op("Reshape", {range, ints({1, 1, 1, 5})});
  Value* queries = g.add_op("Reshape", {range, ints({1, 1, 5, 1})});
  auto expanded = [&](Value* m) { return g.add_op("Expand", {m, batch_shape}); };
  auto additive = [&](Value* seen) {
    return g.add_op("Where", {seen, scalar(g, 0.0f), scalar(g, -INFINITY)});
  };
  Tensor zero = Tensor::zeros(DType::kFloat32, {1});
  Value* causal = g.add_op("LessOrEqual", {keys, queries});
  std::vector<Value*> masks = {
      expanded(g.add_op("GreaterOrEqual", {keys, i64(0)})),  // open
      expanded(g.add_op("GreaterOrEqual", {keys, i64(1)})),  // hides key 0
      g.add_op("ConstantOfShape", {ints({1, 1, 5, 5})}, {{"value", Attribute::of(zero)}}),  // open
      additive(g.add_op("GreaterOrEqual", {keys, i64(3)})),  // hides keys 0 to 2
      expanded(causal),                                      // causal
      additive(causal),                                      // causal, added
      expanded(g.add_op("Less", {keys, queries})),           // hides the diagonal too
  };
  for (Value* mask : masks) g.add_output(g.add_op("Attention", {q, k, v, mask}, {}, GT));
  std::vector<Shape> shapes = {{3, 2, 5, 4}, {3, 2, 5, 4}, {3, 2, 5, 4}};
  auto before = run_all(clone_graph(g), shapes);
  EXPECT_EQ(recognize_attention(g), 4u);
  const std::vector<int> want = {0, -1, 0, -1, 1, 1, -1};  // -1 kept, 0 dropped, 1 causal
  for (size_t i = 0; i < masks.size(); ++i) {
    Node* att = g.outputs()[i]->producer();
    bool kept = att->inputs().size() > 3 && att->input(3) != nullptr;
    EXPECT_EQ(kept ? -1 : static_cast<int>(att->attr_int("causal", 0)), want[i]) << "mask " << i;
  }
  expect_near(run_all(std::move(g), shapes), before, 1e-5f);
}

// nanoGPT's spelling: softmax(masked_fill(q k^T * c, hide, -inf)) v, hide a bool causal mask
// (true above the diagonal): Attention with the mask Not(hide), a constant causal mask, so then
// causal=1 and no mask. A fill other than -inf is no mask.
TEST_F(PassesTest, RecognizeAttentionOfMaskedFillScores) {
  SymShape bhtd = {SymDim::symbol("b"), SymDim(2), SymDim(5), SymDim(4)};
  Graph g = new_graph("masked_fill");
  Value* q = g.add_input("q", {DType::kFloat32, bhtd});
  Value* k = g.add_input("k", {DType::kFloat32, bhtd});
  Value* v = g.add_input("v", {DType::kFloat32, bhtd});
  std::vector<uint8_t> above(25);
  for (int r = 0; r < 5; ++r)
    for (int c = 0; c < 5; ++c) above[static_cast<size_t>(r * 5 + c)] = c > r;
  Tensor hide_t = Tensor::empty(DType::kBool, {5, 5});
  std::memcpy(hide_t.raw_data(), above.data(), above.size());
  Value* hide = g.add_initializer("hide", hide_t);
  auto product = [&](float fill) {
    Value* s =
        g.add_op("Mul", {g.add_op("MatMul", {q, transposed(g, k, {0, 1, 3, 2})}), scalar(g, 0.5f)});
    Value* masked = g.add_op("Where", {hide, scalar(g, fill), s});
    Value* p = g.add_op("Softmax", {masked}, {{"axis", Attribute::of(int64_t{-1})}});
    return g.add_op("MatMul", {p, v});
  };
  g.add_output(product(-INFINITY));
  g.add_output(product(-1e4f));
  std::vector<Shape> shapes = {{3, 2, 5, 4}, {3, 2, 5, 4}, {3, 2, 5, 4}};
  auto before = run_all(clone_graph(g), shapes);
  EXPECT_EQ(recognize_attention(g), 2u);  // fused, then the mask made causal
  Node* att = g.outputs()[0]->producer();
  ASSERT_EQ(att->op_type, "Attention");
  EXPECT_EQ(att->input(0), q);
  EXPECT_EQ(att->input(1), k);
  EXPECT_EQ(att->input(3), nullptr);
  EXPECT_EQ(att->attr_int("causal", 0), 1);
  EXPECT_EQ(g.outputs()[1]->producer()->op_type, "MatMul");  // -1e4: left written out
  expect_near(run_all(std::move(g), shapes), before, 1e-5f);
}

// torch's scaled_dot_product_attention as transformers' GPT-2 captures: the heads transposed out,
// k and v through a one-input Concat (an empty cache), the output through a Reshape to its own
// shape and transposed back. An Attention whose output is returned as it is keeps its layout.
TEST_F(PassesTest, RecognizeAttentionReadsTheHeadsOfAttentionInPlace) {
  Graph g = new_graph("sdpa");
  std::vector<Value*> in = qkv_inputs(g);
  Value *xq = in[0], *xk = in[1], *xv = in[2];
  Value* q = transposed(g, xq, {0, 2, 1, 3});
  Value* k =
      g.add_op("Concat", {transposed(g, xk, {0, 2, 1, 3})}, {{"axis", Attribute::of(int64_t{-2})}});
  Value* v =
      g.add_op("Concat", {transposed(g, xv, {0, 2, 1, 3})}, {{"axis", Attribute::of(int64_t{-2})}});
  Node* a = g.add_node("Attention", {q, k, v}, {"y", "lse", "seed"}, GT);
  a->attributes["causal"] = Attribute::of(int64_t{1});
  Value* same =
      g.add_initializer("same", Tensor::from_vector<int64_t>(DType::kInt64, {4}, {0, 2, 5, 4}));
  Value* y = g.add_op("Reshape", {a->output(0), same});
  g.add_output(transposed(g, y, {0, 2, 1, 3}));
  Node* kept = g.add_node("Attention", {q, k, v}, {"y2", "lse2", "seed2"}, GT);
  g.add_output(kept->output(0));
  std::vector<Shape> shapes = {{3, 5, 2, 4}, {3, 5, 2, 4}, {3, 5, 2, 4}};
  auto before = run_all(clone_graph(g), shapes);
  EXPECT_EQ(recognize_attention(g), 1u);
  EXPECT_EQ(count(g, "Attention"), 2u);
  EXPECT_EQ(kept->attr_int("heads_inside", 0), 0);
  Node* inside = g.outputs()[0]->producer();
  ASSERT_EQ(inside->op_type, "Attention");
  EXPECT_EQ(inside->inputs(), (std::vector<Value*>{xq, xk, xv}));
  EXPECT_EQ(inside->attr_int("heads_inside", 0), 1);
  EXPECT_EQ(inside->attr_int("causal", 0), 1);
  EXPECT_EQ(count(g, "Reshape"), 0u);
  EXPECT_EQ(count(g, "Transpose"), 3u);  // q, k and v of the one kept as it is
  expect_near(run_all(std::move(g), shapes), before, 1e-5f);
}

// Grouped-query attention as transformers writes it: 4 query heads, and keys and values of 2 heads
// each repeated for 2 (repeat_kv: Unsqueeze, Expand, Reshape). Attention reads the 2 heads.
TEST_F(PassesTest, RecognizeAttentionReadsGroupedKeyValueHeadsUnrepeated) {
  Graph g = new_graph("gqa");
  Value* q =
      g.add_input("q", {DType::kFloat32, SymShape{SymDim(3), SymDim(4), SymDim(5), SymDim(8)}});
  Value* k =
      g.add_input("k", {DType::kFloat32, SymShape{SymDim(3), SymDim(2), SymDim(5), SymDim(8)}});
  Value* v =
      g.add_input("v", {DType::kFloat32, SymShape{SymDim(3), SymDim(2), SymDim(5), SymDim(8)}});
  auto ints = [&](std::vector<int64_t> values) {
    return g.add_initializer(
        g.unique_name("c"),
        Tensor::from_vector<int64_t>(DType::kInt64, {int64_t(values.size())}, values));
  };
  auto repeat_kv = [&](Value* x) {
    Value* u = g.add_op("Unsqueeze", {x, ints({2})});
    Value* e = g.add_op("Expand", {u, ints({3, 2, 2, 5, 8})});
    return g.add_op("Reshape", {e, ints({3, 4, 5, 8})});
  };
  Node* a = g.add_node("Attention", {q, repeat_kv(k), repeat_kv(v)}, {"y", "lse", "seed"}, GT);
  a->attributes["causal"] = Attribute::of(int64_t{1});
  g.add_output(a->output(0));
  std::vector<Shape> shapes = {{3, 4, 5, 8}, {3, 2, 5, 8}, {3, 2, 5, 8}};
  auto before = run_all(clone_graph(g), shapes);
  EXPECT_EQ(recognize_attention(g), 1u);
  Node* att = g.outputs()[0]->producer();
  ASSERT_EQ(att->op_type, "Attention");
  EXPECT_EQ(att->inputs(), (std::vector<Value*>{q, k, v}));
  expect_near(run_all(std::move(g), shapes), before, 1e-5f);
}

// x [b, 5, 24] split into q, k and v on its last dim, each reshaped to [b, 5, 2, 4] and transposed
// to heads, an Attention (causal or not) on them, its output transposed back: a fused qkv
// projection's attention. Returns the Attention.
Node* attention_of_split(Graph& g, Value* x, bool causal) {
  Node* split = g.add_node(
      "Split",
      {x, g.add_initializer("parts", Tensor::from_vector<int64_t>(DType::kInt64, {3}, {8, 8, 8}))},
      {"q2", "k2", "v2"});
  split->attributes["axis"] = Attribute::of(int64_t{-1});
  Value* heads =
      g.add_initializer("heads", Tensor::from_vector<int64_t>(DType::kInt64, {4}, {0, 5, 2, 4}));
  std::vector<Value*> qkv;
  for (Value* part : split->outputs())
    qkv.push_back(transposed(g, g.add_op("Reshape", {part, heads}), {0, 2, 1, 3}));
  Node* a = g.add_node("Attention", qkv, {"y_att", "lse", "seed"}, GT);
  if (causal) a->attributes["causal"] = Attribute::of(int64_t{1});
  g.add_output(transposed(g, a->output(0), {0, 2, 1, 3}));
  return a;
}

const SymShape kQkv = {SymDim::symbol("b"), SymDim(5), SymDim(24)};

// A fused projection's output [b, t, 3 h d] split into q, k and v, each reshaped to [b, t, h, d]
// and transposed to heads: the Attention reads the three parts of each row of X in place.
TEST_F(PassesTest, RecognizeAttentionReadsQkvPackedInOneTensor) {
  Graph g = new_graph("qkv");
  Value* x = g.add_input("x", {DType::kFloat32, kQkv});
  attention_of_split(g, x, true);
  std::vector<Shape> shapes = {{3, 5, 24}};
  auto before = run_all(clone_graph(g), shapes);
  EXPECT_EQ(recognize_attention(g), 2u);  // the heads folded, then Q, K, V packed
  Node* att = only(g, "Attention");
  ASSERT_NE(att, nullptr);
  EXPECT_EQ(att->inputs(), (std::vector<Value*>{x, nullptr, nullptr}));
  EXPECT_EQ(att->attr_int("packed", 0), 1);
  EXPECT_EQ(att->attr_int("heads", 0), 2);
  EXPECT_EQ(count(g, "Split") + count(g, "Reshape") + count(g, "Transpose"), 0u);
  expect_near(run_all(std::move(g), shapes), before, 1e-5f);
}

// The qkv projection's bias Add before the Split: the packed Attention takes the bias and adds it
// as it reads; the Add is gone from the forward (and so from the stash).
TEST_F(PassesTest, RecognizeAttentionFoldsTheQkvBiasIntoThePackedAttention) {
  Graph g = new_graph("qkv_bias");
  Value* y = g.add_input("y", {DType::kFloat32, kQkv});
  Value* bias = g.add_input("bias", {DType::kFloat32, SymShape{SymDim(24)}});
  attention_of_split(g, g.add_op("Add", {y, bias}), true);
  std::vector<Shape> shapes = {{3, 5, 24}, {24}};
  auto before = run_all(clone_graph(g), shapes);
  EXPECT_EQ(recognize_attention(g), 3u);  // heads folded, Q, K, V packed, the bias folded
  Node* att = only(g, "Attention");
  ASSERT_NE(att, nullptr);
  EXPECT_EQ(att->inputs(), (std::vector<Value*>{y, nullptr, nullptr, nullptr, bias}));
  EXPECT_EQ(att->attr_int("packed", 0), 1);
  EXPECT_EQ(count(g, "Add"), 0u);
  expect_near(run_all(std::move(g), shapes), before, 1e-5f);
}

// A bias Add whose sum something else reads stays: the Attention reads the sum.
TEST_F(PassesTest, RecognizeAttentionKeepsABiasAddWithOtherReaders) {
  Graph g = new_graph("qkv_bias_kept");
  Value* y = g.add_input("y", {DType::kFloat32, kQkv});
  Value* bias = g.add_input("bias", {DType::kFloat32, SymShape{SymDim(24)}});
  Value* x = g.add_op("Add", {bias, y});
  g.add_output(x);
  attention_of_split(g, x, false);
  EXPECT_EQ(recognize_attention(g), 2u);
  Node* att = only(g, "Attention");
  ASSERT_NE(att, nullptr);
  EXPECT_EQ(att->inputs(), (std::vector<Value*>{x, nullptr, nullptr}));
  EXPECT_EQ(count(g, "Add"), 1u);
}

// ---- fuse_loss_gradient ------------------------------------------------------------------------

// scores [5, 7] (x * 1: an intermediate that dies at the loss) -> SoftmaxCrossEntropyLoss against
// fixed labels (one ignored, with weights), the scores' gradient through autodiff; `scale`
// multiplies the loss (dloss = scale). Run three times: from the second run on the memory plan has
// the fused loss write the stashed gradient over the scores, which must not change a bit.
std::vector<std::vector<float>> loss_and_gradient(bool fuse, const std::string& reduction,
                                                  float scale, size_t* fused, size_t* taken_over) {
  Graph g = new_graph("loss");
  Value* input = g.add_input("x", {DType::kFloat32, SymShape{SymDim(5), SymDim(7)}});
  Value* x = g.add_op("Mul", {input, scalar(g, 1.0f)});
  Value* labels = g.add_initializer(
      "labels", Tensor::from_vector<int64_t>(DType::kInt64, {5}, {3, 0, 6, 2, 3}));
  Value* weights = g.add_initializer(
      "weights", Tensor::from_vector<float>(DType::kFloat32, {7}, {1, 2, 1, 0.5f, 1, 1, 3}));
  Node* loss = g.add_node("SoftmaxCrossEntropyLoss", {x, labels, weights}, {"raw"});
  loss->attributes["reduction"] = Attribute::of(reduction);
  loss->attributes["ignore_index"] = Attribute::of(int64_t{2});
  Value* c = g.add_initializer("c", Tensor::from_vector<float>(DType::kFloat32, {}, {scale}));
  Node* mul = g.add_node("Mul", {loss->output(0), c}, {"loss"});
  g.add_output(mul->output(0));
  infer_shapes(g);
  *fused = fuse ? fuse_loss_gradient(g) : 0;
  GradientGraphs gg = build_gradient_graphs(g, {{"loss"}, true, {"x"}});
  Session fwd(std::move(gg.forward)), bwd(std::move(gg.backward));
  Tensor xs = Tensor::empty(DType::kFloat32, {5, 7});
  for (int64_t k = 0; k < 35; ++k) xs.data<float>()[k] = static_cast<float>((k * 37) % 23) / 5.0f;
  std::vector<std::vector<float>> first;
  for (int run = 0; run < 3; ++run) {
    std::vector<Tensor> out = fwd.run(std::vector<Tensor>{xs});
    std::vector<Tensor> grads = bwd.run(std::vector<Tensor>(out.begin() + 1, out.end()));
    std::vector<std::vector<float>> got = {{out[0].data<float>(), out[0].data<float>() + 1},
                                           {grads[0].data<float>(), grads[0].data<float>() + 35}};
    if (run == 0) first = got;
    EXPECT_EQ(got, first) << "run " << run;
  }
  const MemoryPlan* plan = fwd.memory_plan();
  *taken_over =
      plan ? static_cast<size_t>(std::count(plan->lent.begin(), plan->lent.end(), true)) : 0;
  return first;
}

TEST_F(PassesTest, FuseLossGradientWritesTheGradientInTheForward) {
  for (const char* reduction : {"mean", "sum"})
    for (float scale : {1.0f, 0.25f}) {
      size_t fused = 0, unfused = 0, taken = 0, taken_unfused = 0;
      auto want = loss_and_gradient(false, reduction, scale, &unfused, &taken_unfused);
      auto got = loss_and_gradient(true, reduction, scale, &fused, &taken);
      EXPECT_EQ(fused, 1u);
      expect_near(got, want, 1e-6f);
      // The fused loss's stashed gradient takes over the dying scores' storage.
      EXPECT_EQ(taken, taken_unfused + 1);
    }
}

TEST_F(PassesTest, FuseLossGradientLeavesPerItemLossesAndReadLogProbs) {
  Graph g = new_graph("losses");
  Value* x = g.add_input("x", {DType::kFloat32, SymShape{SymDim(5), SymDim(7)}});
  Value* labels = g.add_initializer(
      "labels", Tensor::from_vector<int64_t>(DType::kInt64, {5}, {1, 0, 6, 2, 3}));
  Node* none = g.add_node("SoftmaxCrossEntropyLoss", {x, labels}, {"per_item"});
  none->attributes["reduction"] = Attribute::of(std::string("none"));
  Node* read = g.add_node("SoftmaxCrossEntropyLoss", {x, labels}, {"loss", "log_prob"});
  g.add_output(none->output(0));
  g.add_output(read->output(0));
  g.add_output(read->output(1));
  EXPECT_EQ(fuse_loss_gradient(g), 0u);
  EXPECT_EQ(count(g, "SoftmaxCrossEntropyLoss"), 2u);
}

// ---- stash_gelu_derivative ---------------------------------------------------------------------

// loss = sum(GELU(x + bias) * w) trained through autodiff: the loss and the gradients of x and
// bias, and what the forward stashes (name -> shape). With `stash`, stash_gelu_derivative runs
// before autodiff and fuse_elementwise after it on both graphs (its ops in *ops, the backward's
// ops in *backward_ops).
struct GeluTraining {
  std::vector<std::vector<float>> values;
  std::vector<std::string> stashed;
  std::vector<std::string> forward_ops, backward_ops;
  size_t rewrites = 0;
};
GeluTraining gelu_training(const std::string& approximate, int64_t c, bool stash) {
  Graph g = new_graph("gelu_mlp");
  SymShape shape = {SymDim::symbol("b"), SymDim(3), SymDim(c)};
  Value* x = g.add_input("x", {DType::kFloat32, shape});
  Value* bias = g.add_input("bias", {DType::kFloat32, SymShape{SymDim(c)}});
  Value* w = g.add_input("w", {DType::kFloat32, shape});
  Value* y =
      g.add_op("Gelu", {g.add_op("Add", {x, bias})}, {{"approximate", Attribute::of(approximate)}});
  Node* sum = g.add_node("ReduceSum", {g.add_op("Mul", {y, w})}, {"loss"});
  sum->attributes["keepdims"] = Attribute::of(int64_t{0});
  g.add_output(sum->output(0));
  infer_shapes(g);
  GeluTraining t;
  if (stash) t.rewrites = stash_gelu_derivative(g);
  GradientGraphs gg = build_gradient_graphs(g, {{"loss"}, true, {"x", "bias"}});
  if (stash) {
    fuse_elementwise(gg.forward);
    fuse_elementwise(gg.backward);
  }
  for (Node* n : gg.forward.topological_order())
    if (n->op_type == "FusedElementwise")
      for (const std::string& op : n->attr("ops", Attribute::Kind::kStrings).strings)
        t.forward_ops.push_back(op);
  for (Node* n : gg.backward.topological_order()) t.backward_ops.push_back(n->op_type);
  for (const std::string& name : gg.stashed) {
    const Value* v = gg.forward.find(name);
    t.stashed.push_back(v && v->producer() ? v->producer()->op_type : "input " + name);
  }
  Session fwd(std::move(gg.forward)), bwd(std::move(gg.backward));
  std::vector<Tensor> in;
  for (Shape s : {Shape{2, 3, c}, Shape{c}, Shape{2, 3, c}}) {
    Tensor v = Tensor::empty(DType::kFloat32, s);
    for (int64_t k = 0; k < v.numel(); ++k)
      v.data<float>()[k] = static_cast<float>((k * 37 + s.size() * 11) % 97) / 16.0f - 3.0f;
    in.push_back(v);
  }
  std::vector<Tensor> out = fwd.run(in);
  std::vector<Tensor> grads = bwd.run(std::vector<Tensor>(out.begin() + 1, out.end()));
  for (const Tensor& v : {out[0], grads[0], grads[1]})
    t.values.emplace_back(v.data<float>(), v.data<float>() + v.numel());
  return t;
}

TEST_F(PassesTest, StashGeluDerivativeMakesTheGradientOneProduct) {
  for (const std::string approximate : {"none", "tanh"})
    for (int64_t c : {37, 16}) {
      SCOPED_TRACE(approximate + " " + std::to_string(c));
      GeluTraining plain = gelu_training(approximate, c, false);
      GeluTraining t = gelu_training(approximate, c, true);
      EXPECT_EQ(t.rewrites, 1u);
      // The forward's one pass: the bias add, GELU and its derivative (and the product with w).
      std::string gelu = approximate == "tanh" ? "GeluTanh" : "Gelu";
      EXPECT_EQ(t.forward_ops, (std::vector<std::string>{"Add", gelu, gelu + "Derivative", "Mul"}));
      // The backward multiplies: no GeluGrad; it reads the derivative where it read x + bias.
      EXPECT_EQ(std::count(t.backward_ops.begin(), t.backward_ops.end(), "GeluGrad"), 0);
      EXPECT_EQ(std::count(plain.backward_ops.begin(), plain.backward_ops.end(), "GeluGrad"), 1);
      EXPECT_EQ(std::count(plain.stashed.begin(), plain.stashed.end(), "Add"), 1);
      EXPECT_EQ(std::count(t.stashed.begin(), t.stashed.end(), "Add"), 0);
      EXPECT_EQ(t.stashed.size(), plain.stashed.size());
      expect_near(t.values, plain.values, 2e-6f);
    }
  // The biased X read after the pass (a graph output here) is still written by it, and a GELU
  // with its derivative and no Add runs as one pass too: the values of the unfused kernels.
  for (bool biased : {true, false}) {
    Graph g = new_graph("joint");
    Value* x = g.add_input("x", {DType::kFloat32, kBTC});
    Value* b = g.add_input("b", {DType::kFloat32, SymShape{SymDim(6)}});
    Value* v = biased ? g.add_op("Add", {x, b}) : x;
    Node* gelu = g.add_node("Gelu", {v}, {"y", "dy_dx"}, GT, "gelu");
    g.add_output(g.add_op("Neg", {gelu->output(0)}));
    g.add_output(gelu->output(1));
    if (biased) g.add_output(v);
    auto before = run_all(clone_graph(g), {{2, 4, 6}, {6}});
    EXPECT_EQ(fuse_elementwise(g), 1u);
    EXPECT_EQ(g.num_nodes(), 1u);
    SCOPED_TRACE(biased);
    EXPECT_EQ(run_all(std::move(g), {{2, 4, 6}, {6}}), before);
  }
  // Left alone: a Gelu of another approximation.
  Graph g = new_graph("other");
  Value* x = g.add_input("x", {DType::kFloat32, kBTC});
  g.add_output(g.add_op("Gelu", {x}, {{"approximate", Attribute::of(std::string("fast"))}}));
  EXPECT_EQ(stash_gelu_derivative(g), 0u);
}

// ---- fuse_layer_norm ---------------------------------------------------------------------------

// A transformer block's tail: s = (m + bias) + r feeds a LayerNorm and the next residual; the
// LayerNorm's input gradient plus the residual's gradient.
TEST_F(PassesTest, FuseLayerNormTakesTheResidualAddAndItsGradient) {
  Graph g = new_graph("block");
  Value* m = g.add_input("m", {DType::kFloat32, kBTC});
  Value* r = g.add_input("r", {DType::kFloat32, kBTC});
  Value* bias = g.add_input("bias", {DType::kFloat32, SymShape{SymDim(6)}});
  Value* scale = g.add_input("scale", {DType::kFloat32, SymShape{SymDim(6)}});
  Value* b = g.add_input("b", {DType::kFloat32, SymShape{SymDim(6)}});
  Value* dy = g.add_input("dy", {DType::kFloat32, kBTC});
  Value* dres = g.add_input("dres", {DType::kFloat32, kBTC});
  Value* s = g.add_op("Add", {r, g.add_op("Add", {bias, m})});
  Node* ln = g.add_node("LayerNormalization", {s, scale, b}, {"y", "mean", "inv"});
  ln->attributes["axis"] = Attribute::of(int64_t{-1});
  ln->scope = "blocks.0.ln";
  Value* next = g.add_op("Mul", {s, ln->outputs()[0]});  // the residual stream goes on
  Node* grad =
      g.add_node("LayerNormalizationGrad", {dy, s, scale, ln->outputs()[1], ln->outputs()[2]},
                 {"dx", "dscale", "dbias"}, GT);
  grad->attributes["axis"] = Attribute::of(int64_t{-1});
  Value* dsum = g.add_op("Add", {dres, grad->outputs()[0]});
  for (Value* v : {ln->outputs()[0], ln->outputs()[1], ln->outputs()[2], s, next, dsum,
                   grad->outputs()[1], grad->outputs()[2]})
    g.add_output(v);
  std::vector<Shape> shapes = {{3, 4, 6}, {3, 4, 6}, {6}, {6}, {6}, {3, 4, 6}, {3, 4, 6}};
  auto before = run_all(clone_graph(g), shapes);
  EXPECT_EQ(fuse_layer_norm(g), 2u);
  EXPECT_EQ(count(g, "AddLayerNormalization"), 1u);
  EXPECT_EQ(count(g, "LayerNormalization"), 0u);
  EXPECT_EQ(count(g, "Add"), 0u);  // the bias, the residual and the gradients' sum
  EXPECT_EQ(count(g, "LayerNormalizationGrad"), 1u);
  for (Node* n : g.nodes()) {
    if (n->op_type == "AddLayerNormalization") {
      EXPECT_EQ(n->scope, "blocks.0.ln");
    }
  }
  EXPECT_EQ(g.outputs()[3]->name(), s->name());  // the sum keeps its name
  expect_near(run_all(std::move(g), shapes), before, 1e-5f);
}

// The same for an RMSNorm (Llama's residual stream): AddRMSNormalization with the sum as output 2,
// and RMSNormalizationGrad with the residual's gradient as input 4; graphtrain's RMSNormalization
// or ONNX's (opset 23).
TEST_F(PassesTest, FuseLayerNormTakesTheResidualAddBeforeAnRmsNorm) {
  for (const char* domain : {GT, ""}) {
    Graph g = new_graph("llama_block");
    if (!*domain) g.opset_imports[""] = 23;
    Value* a = g.add_input("a", {DType::kFloat32, kBTC});
    Value* r = g.add_input("r", {DType::kFloat32, kBTC});
    Value* scale = g.add_input("scale", {DType::kFloat32, SymShape{SymDim(6)}});
    Value* dy = g.add_input("dy", {DType::kFloat32, kBTC});
    Value* dres = g.add_input("dres", {DType::kFloat32, kBTC});
    Value* s = g.add_op("Add", {a, r});
    Node* rms = g.add_node("RMSNormalization", {s, scale}, {"y", "inv"}, domain);
    rms->attributes["axis"] = Attribute::of(int64_t{-1});
    rms->attributes["epsilon"] = Attribute::of(1e-6f);
    Node* grad =
        g.add_node("RMSNormalizationGrad", {dy, s, scale, rms->outputs()[1]}, {"dx", "dscale"}, GT);
    grad->attributes["axis"] = Attribute::of(int64_t{-1});
    Value* dsum = g.add_op("Add", {grad->outputs()[0], dres});
    for (Value* v : {rms->outputs()[0], rms->outputs()[1], s, dsum, grad->outputs()[1]})
      g.add_output(v);
    std::vector<Shape> shapes = {{3, 4, 6}, {3, 4, 6}, {6}, {3, 4, 6}, {3, 4, 6}};
    auto before = run_all(clone_graph(g), shapes);
    EXPECT_EQ(fuse_layer_norm(g), 2u);
    EXPECT_EQ(count(g, "AddRMSNormalization"), 1u);
    EXPECT_EQ(count(g, "RMSNormalization"), 0u);
    EXPECT_EQ(count(g, "Add"), 0u);
    EXPECT_EQ(count(g, "RMSNormalizationGrad"), 1u);
    EXPECT_EQ(g.outputs()[2]->name(), s->name());
    EXPECT_EQ(g.outputs()[2]->producer_output(), 2);
    expect_near(run_all(std::move(g), shapes), before, 1e-5f);
  }
}

// A Rotary of heads transposed out of [b, t, h, d] with Cos and Sin the same for every head rotates
// [b, t, h, d] and is transposed after (Cos's unsqueeze(1) becomes unsqueeze(2), any other Cos a
// Transpose); one with a Cos per head stays.
TEST_F(PassesTest, RecognizeRotaryRotatesHeadsInPlace) {
  Graph g = new_graph("rotary_heads");
  Value* x = g.add_input(
      "x", {DType::kFloat32, SymShape{SymDim::symbol("b"), SymDim(5), SymDim(2), SymDim(8)}});
  Value* c = g.add_input("c", {DType::kFloat32, SymShape{SymDim(1), SymDim(5), SymDim(8)}});
  Value* s =
      g.add_input("s", {DType::kFloat32, SymShape{SymDim(1), SymDim(1), SymDim(5), SymDim(8)}});
  Value* per_head =
      g.add_input("ch", {DType::kFloat32, SymShape{SymDim(1), SymDim(2), SymDim(5), SymDim(8)}});
  Value* one = g.add_initializer(
      "one", Tensor::from_vector<int64_t>(DType::kInt64, {1}, std::vector<int64_t>{1}));
  Value* cos = g.add_op("Unsqueeze", {c, one});
  auto heads = [&](Value* v) {
    return g.add_op("Transpose", {v}, {{"perm", Attribute::of(std::vector<int64_t>{0, 2, 1, 3})}});
  };
  g.add_output(g.add_op("Rotary", {heads(x), cos, s}, {}, GT));
  g.add_output(g.add_op("Rotary", {heads(x), per_head, s}, {}, GT));
  std::vector<Shape> shapes = {{3, 5, 2, 8}, {1, 5, 8}, {1, 1, 5, 8}, {1, 2, 5, 8}};
  auto before = run_all(clone_graph(g), shapes);
  EXPECT_EQ(recognize_rotary(g), 1u);
  Node* back = g.outputs()[0]->producer();
  ASSERT_EQ(back->op_type, "Transpose");
  Node* rot = back->input(0)->producer();
  ASSERT_EQ(rot->op_type, "Rotary");
  EXPECT_EQ(rot->input(0), x);
  EXPECT_EQ(rot->input(1)->producer()->op_type, "Unsqueeze");
  EXPECT_EQ(rot->input(1)->producer()->input(0), c);
  EXPECT_EQ(rot->input(2)->producer()->op_type, "Transpose");
  Node* kept = g.outputs()[1]->producer();
  EXPECT_EQ(kept->op_type, "Rotary");
  EXPECT_EQ(kept->input(0)->producer()->op_type, "Transpose");
  expect_near(run_all(std::move(g), shapes), before, 1e-6f);
}

// ---- recognize_silu_mul ------------------------------------------------------------------------

// (g, u [2, 5]) -> Exp(silu(g) * u), silu written g * Sigmoid(g); the products' operands in the
// order `swap` picks; with `shared`, the sigmoid is also a graph output.
Graph spelled_silu_mul(bool swap, bool shared = false) {
  Graph g;
  g.name = "swiglu";
  g.opset_imports[""] = 18;
  g.opset_imports[GT] = 1;
  Value* gate = g.add_input("g", {DType::kFloat32, SymShape{SymDim(2), SymDim(5)}});
  Value* up = g.add_input("u", {DType::kFloat32, SymShape{SymDim(2), SymDim(5)}});
  Value* sig = g.add_op("Sigmoid", {gate});
  Value* silu = swap ? g.add_op("Mul", {sig, gate}) : g.add_op("Mul", {gate, sig});
  Value* y = swap ? g.add_op("Mul", {up, silu}) : g.add_op("Mul", {silu, up});
  g.add_output(g.add_op("Exp", {y}));
  if (shared) g.add_output(sig);
  infer_shapes(g);
  return g;
}

TEST_F(PassesTest, RecognizeSiluMulBecomesOneOp) {
  for (bool swap : {false, true}) {
    Graph g = spelled_silu_mul(swap);
    std::vector<Shape> shapes = {{2, 5}, {2, 5}};
    auto before = run_all(clone_graph(g), shapes);
    ASSERT_EQ(recognize_silu_mul(g), 1u) << swap;
    EXPECT_EQ(g.num_nodes(), 2u);  // SiluMul and the Exp
    EXPECT_EQ(count(g, "SiluMul"), 1u);
    expect_near(run_all(std::move(g), shapes), before, 1e-6f);
  }
  Graph shared = spelled_silu_mul(false, true);
  EXPECT_EQ(recognize_silu_mul(shared), 0u);
}

// A bare SiLU, x * Sigmoid(x) in either order (a convolutional net's activation), becomes SiluMul
// without U; x * Sigmoid(y) stays.
TEST_F(PassesTest, RecognizeSiluMulTakesABareSilu) {
  for (bool swap : {false, true}) {
    Graph g = new_graph("silu");
    Value* x = g.add_input("x", {DType::kFloat32, SymShape{SymDim(3), SymDim(7)}});
    Value* y = g.add_input("y", {DType::kFloat32, SymShape{SymDim(3), SymDim(7)}});
    Value* sig = g.add_op("Sigmoid", {x});
    g.add_output(g.add_op("Exp", {swap ? g.add_op("Mul", {sig, x}) : g.add_op("Mul", {x, sig})}));
    g.add_output(g.add_op("Mul", {x, g.add_op("Sigmoid", {y})}));
    infer_shapes(g);
    std::vector<Shape> shapes = {{3, 7}, {3, 7}};
    auto before = run_all(clone_graph(g), shapes);
    ASSERT_EQ(recognize_silu_mul(g), 1u) << swap;
    EXPECT_EQ(count(g, "SiluMul"), 1u);
    EXPECT_EQ(count(g, "Sigmoid"), 1u);  // y's
    expect_near(run_all(std::move(g), shapes), before, 1e-6f);
  }
}

// ---- fold_pad_into_conv ------------------------------------------------------------------------

// x [2, 3, 7, 6] -> Conv(Pad(x, pads), w [4, 3, 3, 3], strides 2, pads 1 0 0 1) + Exp (pads in
// ONNX order, begins then ends, over all four dims; `fill` a constant value input when set).
Graph padded_conv(std::vector<int64_t> pads, std::optional<float> fill = std::nullopt,
                  const std::string& mode = "constant", bool pad_is_output = false) {
  Graph g = new_graph("padded_conv");
  Value* x =
      g.add_input("x", {DType::kFloat32, SymShape{SymDim(2), SymDim(3), SymDim(7), SymDim(6)}});
  Value* w =
      g.add_input("w", {DType::kFloat32, SymShape{SymDim(4), SymDim(3), SymDim(3), SymDim(3)}});
  Value* p = g.add_initializer("pads", Tensor::from_vector<int64_t>(DType::kInt64, {8}, pads));
  std::vector<Value*> pad_in = {x, p};
  if (fill) pad_in.push_back(scalar(g, *fill));
  Value* padded = g.add_op("Pad", pad_in, {{"mode", Attribute::of(mode)}});
  Value* y = g.add_op("Conv", {padded, w},
                      {{"strides", Attribute::of(std::vector<int64_t>{2, 2})},
                       {"pads", Attribute::of(std::vector<int64_t>{1, 0, 0, 1})}});
  g.add_output(g.add_op("Exp", {y}));
  if (pad_is_output) g.add_output(padded);
  infer_shapes(g);
  return g;
}

TEST_F(PassesTest, FoldPadIntoConvAddsTheAmountsToTheConvsPads) {
  const std::vector<Shape> shapes = {{2, 3, 7, 6}, {4, 3, 3, 3}};
  for (std::optional<float> fill : {std::optional<float>(), std::optional<float>(0.0f)}) {
    // TensorFlow's SAME for a stride-2 3x3 kernel: 0 before, 1 after; and 2 before W.
    Graph g = padded_conv({0, 0, 0, 2, 0, 0, 1, 1}, fill);
    auto before = run_all(clone_graph(g), shapes);
    ASSERT_EQ(fold_pad_into_conv(g), 1u);
    EXPECT_EQ(count(g, "Pad"), 0u);
    const Node* conv = nullptr;
    for (Node* n : g.nodes())
      if (n->op_type == "Conv") conv = n;
    ASSERT_NE(conv, nullptr);
    EXPECT_EQ(conv->input(0), g.inputs()[0]);
    EXPECT_EQ(conv->attr_ints("pads"), (std::vector<int64_t>{1, 2, 1, 2}));
    expect_near(run_all(std::move(g), shapes), before, 1e-6f);
  }
  // A Pad another reader keeps (a graph output) stays for it; the Conv reads x all the same.
  Graph shared = padded_conv({0, 0, 1, 1, 0, 0, 1, 1}, std::nullopt, "constant", true);
  auto before = run_all(clone_graph(shared), shapes);
  ASSERT_EQ(fold_pad_into_conv(shared), 1u);
  EXPECT_EQ(count(shared, "Pad"), 1u);
  expect_near(run_all(std::move(shared), shapes), before, 1e-6f);
}

TEST_F(PassesTest, FoldPadIntoConvLeavesOtherPads) {
  Graph filled = padded_conv({0, 0, 1, 1, 0, 0, 1, 1}, 1.0f);
  EXPECT_EQ(fold_pad_into_conv(filled), 0u) << "a non-zero fill";
  Graph batch = padded_conv({1, 0, 1, 1, 0, 0, 1, 1});
  EXPECT_EQ(fold_pad_into_conv(batch), 0u) << "a pad on the batch dim";
  Graph crop = padded_conv({0, 0, -1, 1, 0, 0, 1, 1});
  EXPECT_EQ(fold_pad_into_conv(crop), 0u) << "a negative pad (a crop)";
  Graph reflect = padded_conv({0, 0, 1, 1, 0, 0, 1, 1}, std::nullopt, "reflect");
  EXPECT_EQ(fold_pad_into_conv(reflect), 0u) << "reflect mode";
  Graph same = padded_conv({0, 0, 1, 1, 0, 0, 1, 1});
  for (Node* n : same.nodes())
    if (n->op_type == "Conv") {
      n->attributes.erase("pads");
      n->attributes["auto_pad"] = Attribute::of(std::string("SAME_UPPER"));
    }
  EXPECT_EQ(fold_pad_into_conv(same), 0u) << "a Conv with auto_pad";
}

TEST_F(PassesTest, FuseLayerNormLeavesBroadcastResidualsAndOtherAxes) {
  Graph g = new_graph("other_norms");
  Value* x = g.add_input("x", {DType::kFloat32, kBTC});
  Value* row = g.add_input("row", {DType::kFloat32, SymShape{SymDim(6)}});
  Value* scale = g.add_input("scale", {DType::kFloat32, SymShape{SymDim(6)}});
  Value* scale4 = g.add_input("scale4", {DType::kFloat32, SymShape{SymDim(4), SymDim(6)}});
  g.add_output(g.add_op("LayerNormalization", {g.add_op("Add", {x, row}), scale}));
  g.add_output(g.add_op("LayerNormalization", {g.add_op("Add", {x, x}), scale4},
                        {{"axis", Attribute::of(int64_t{1})}}));
  // A scale read after the sum (as ZeRO-3 gathers a module's parameters after its input): fusing
  // would make a cycle.
  Value* sum = g.add_op("Add", {x, g.add_input("y", {DType::kFloat32, kBTC})});
  Value* late = g.add_op(
      "Add", {scale, g.add_op("ReduceSum", {sum}, {{"keepdims", Attribute::of(int64_t{0})}})});
  g.add_output(g.add_op("LayerNormalization", {sum, late}));
  EXPECT_EQ(fuse_layer_norm(g), 0u);
  EXPECT_NO_THROW(g.topological_order());
}

TEST_F(PassesTest, ConstantFoldingLeavesRandomAndLargeNodes) {
  Graph g = new_graph("nofold");
  Tensor big = Tensor::zeros(DType::kFloat32, {100, 100});
  Value* c = g.add_initializer("big", big);
  Value* d = g.add_op("Dropout", {scalar(g, 1.0f), scalar(g, 0.5f)});
  g.add_output(g.add_op("Exp", {c}));
  g.add_output(d);
  EXPECT_EQ(fold_constants(g), 0u);
}

}  // namespace
}  // namespace graphtrain
