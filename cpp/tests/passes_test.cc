// Graph passes: each pass fires where it should, keeps graph outputs and callback nodes, and leaves
// results unchanged; the pipeline honors GRAPHTRAIN_ENABLE_COMPUTE_OPTIMIZER and
// GRAPHTRAIN_DISABLE_PASSES.
#include <gtest/gtest.h>

#include "graphtrain/error.h"
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
  EXPECT_EQ(names, (std::vector<std::string>{"identities", "dead_code"}));

  Graph g = chain();
  auto ran = optimize_graph(g, "test");
  ASSERT_EQ(ran.size(), 2u);
  EXPECT_EQ(ran[0], (std::pair<std::string, size_t>{"identities", 2}));
  EXPECT_EQ(ran[1], (std::pair<std::string, size_t>{"dead_code", 1}));

  Options::global().set("disable_passes", " dead_code ");
  Graph h = chain();
  ran = optimize_graph(h, "test");
  ASSERT_EQ(ran.size(), 1u);
  EXPECT_EQ(ran[0].first, "identities");
  EXPECT_EQ(count(h, "Exp"), 1u);

  Options::global().set("enable_compute_optimizer", "0");
  Graph off = chain();
  EXPECT_TRUE(optimize_graph(off, "test").empty());
  EXPECT_EQ(off.nodes().size(), chain().nodes().size());
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
    EXPECT_NE(msg.find("the passes are: identities, dead_code"), std::string::npos);
  }
}

}  // namespace
}  // namespace graphtrain
