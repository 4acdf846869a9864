// The memory planner (lifetimes -> arena offsets) and Sessions that follow its plans: the same
// results as fresh allocation, in-place kernels sharing memory, and nothing a run hands out
// (results, tensors given to a callback) overwritten by a later run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "graphtrain/callback.h"
#include "graphtrain/memory_plan.h"
#include "graphtrain/options.h"
#include "graphtrain/session.h"
#include "graphtrain/training_session.h"
#include "test_graphs.h"

namespace graphtrain {
namespace {

BufferUse use(size_t bytes, size_t first, size_t last, int inplace_of = -1) {
  BufferUse u;
  u.bytes = bytes;
  u.first_step = first;
  u.last_step = last;
  u.inplace_of = inplace_of;
  return u;
}

// Buffers alive at once never share a byte, and all fit the arena.
void expect_valid(const std::vector<BufferUse>& buffers, const MemoryPlan& plan) {
  auto end = [&](size_t i) { return static_cast<size_t>(plan.offsets[i]) + buffers[i].bytes; };
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (plan.offsets[i] < 0) continue;
    EXPECT_EQ(static_cast<size_t>(plan.offsets[i]) % kArenaAlignment, 0u);
    EXPECT_LE(end(i), plan.arena_bytes);
    for (size_t j = 0; j < i; ++j) {
      bool merged = buffers[i].inplace_of == static_cast<int>(j) &&
                    plan.offsets[i] == plan.offsets[j] &&
                    buffers[j].last_step == buffers[i].first_step;
      if (plan.offsets[j] < 0 || merged) continue;
      bool together = buffers[i].first_step <= buffers[j].last_step &&
                      buffers[j].first_step <= buffers[i].last_step;
      bool apart = end(i) <= static_cast<size_t>(plan.offsets[j]) ||
                   end(j) <= static_cast<size_t>(plan.offsets[i]);
      if (together) {
        EXPECT_TRUE(apart) << "buffers " << j << " and " << i;
      }
    }
  }
}

TEST(MemoryPlan, BuffersShareBytesOnlyWhenTheirLifetimesDoNotOverlap) {
  std::vector<BufferUse> b = {use(1000, 0, 2), use(500, 1, 3), use(1000, 3, 5), use(4000, 0, 5)};
  b[3].outside = true;  // a graph output: not in the arena
  MemoryPlan plan = plan_memory(b);
  expect_valid(b, plan);
  EXPECT_EQ(plan.offsets[0], plan.offsets[2]);  // the third reuses the first's bytes
  EXPECT_EQ(plan.offsets[3], -1);
  EXPECT_EQ(plan.arena_bytes, 1024u + 512u);
  EXPECT_EQ(plan.planned_bytes, 2500u);
  EXPECT_EQ(plan.outside_bytes, 4000u);

  std::mt19937 rng(7);
  std::vector<BufferUse> many;
  for (int i = 0; i < 300; ++i) {
    size_t first = rng() % 100;
    many.push_back(use(1 + rng() % 100000, first, first + rng() % 20));
  }
  MemoryPlan big = plan_memory(many);
  expect_valid(many, big);
  size_t peak = 0;  // the most bytes alive at one step: no plan can do with less
  for (size_t step = 0; step < 120; ++step) {
    size_t alive = 0;
    for (const BufferUse& u : many)
      if (u.first_step <= step && step <= u.last_step) alive += u.bytes;
    peak = std::max(peak, alive);
  }
  EXPECT_GE(big.arena_bytes, peak);
  EXPECT_LT(big.arena_bytes, big.planned_bytes / 2);
}

TEST(MemoryPlan, InPlaceOutputTakesItsDyingInputsBytes) {
  // a -> b in place -> c in place: one buffer for all three.
  std::vector<BufferUse> chain = {use(256, 0, 1), use(256, 1, 2, 0), use(256, 2, 4, 1),
                                  use(256, 1, 3)};
  MemoryPlan plan = plan_memory(chain);
  expect_valid(chain, plan);
  EXPECT_EQ(plan.inplace, 2u);
  EXPECT_EQ(plan.offsets[0], plan.offsets[1]);
  EXPECT_EQ(plan.offsets[1], plan.offsets[2]);
  EXPECT_EQ(plan.arena_bytes, 512u);

  // Not in place: the input lives on past the step, or has another size, or was taken already.
  std::vector<BufferUse> no = {use(256, 0, 3),    use(256, 1, 2, 0), use(128, 0, 1),
                               use(256, 1, 2, 2), use(256, 0, 1),    use(256, 1, 1, 4),
                               use(256, 1, 2, 4)};
  MemoryPlan p = plan_memory(no);
  expect_valid(no, p);
  EXPECT_EQ(p.inplace, 1u);  // only the first claim on buffer 4
  EXPECT_EQ(p.offsets[5], p.offsets[4]);
  EXPECT_NE(p.offsets[6], p.offsets[4]);
}

// A buffer that outlives the run (a result, a stashed value) written in place over a dying input
// takes over that input's storage: both are allocated apart, the arena has neither.
TEST(MemoryPlan, AResultTakesOverItsDyingInput) {
  std::vector<BufferUse> b = {use(256, 0, 1), use(256, 1, 3, 0), use(512, 0, 2)};
  b[1].outside = true;
  MemoryPlan plan = plan_memory(b);
  expect_valid(b, plan);
  EXPECT_EQ(plan.takes[1], 0);
  EXPECT_TRUE(plan.lent[0]);
  EXPECT_EQ(plan.offsets[0], -1);
  EXPECT_EQ(plan.inplace, 1u);
  EXPECT_EQ(plan.planned_bytes, 512u);  // buffer 2 alone
  EXPECT_EQ(plan.arena_bytes, 512u);

  // Not taken over: an input already written in place over another (it shares that one's arena
  // bytes), one that lives on, one of another size.
  std::vector<BufferUse> no = {use(256, 0, 1),   use(256, 1, 2, 0), use(256, 2, 3, 1),
                               use(256, 0, 4),   use(256, 1, 3, 3), use(128, 0, 1),
                               use(256, 1, 2, 5)};
  for (size_t i : {2u, 4u, 6u}) no[i].outside = true;
  MemoryPlan p = plan_memory(no);
  expect_valid(no, p);
  for (size_t i = 0; i < no.size(); ++i) EXPECT_EQ(p.takes[i], -1) << "buffer " << i;
  EXPECT_EQ(p.inplace, 1u);  // buffer 1 over buffer 0, in the arena
  EXPECT_EQ(p.offsets[1], p.offsets[0]);
}

// x -> Exp -> Mul(c) -> Sigmoid -> Neg -> Softmax: each elementwise node may write over its
// input, which dies there.
Graph elementwise_chain() {
  Graph g;
  g.name = "chain";
  g.opset_imports[""] = 18;
  Value* x = g.add_input("x", {DType::kFloat32, SymShape{SymDim::symbol("n"), SymDim(64)}});
  Value* c = g.add_initializer("c", Tensor::from_vector<float>(DType::kFloat32, {}, {0.5f}));
  Value* h = g.add_op("Exp", {x});
  h = g.add_op("Mul", {h, c});
  h = g.add_op("Sigmoid", {h});
  h = g.add_op("Neg", {h});
  Node* out = g.add_node("Softmax", {h}, {"y"});
  g.add_output(out->outputs()[0]);
  return g;
}

Tensor input(int64_t rows, float phase) {
  Tensor x = Tensor::empty(DType::kFloat32, {rows, 64});
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = std::sin(0.37f * i + phase);
  return x;
}

std::vector<float> values(const Tensor& t) {
  return std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
}

class PlannedSession : public ::testing::Test {
 protected:
  void TearDown() override {
    Options::global().reload();
    set_host_callback({});
  }
};

TEST_F(PlannedSession, SameResultsAsFreshTensorsWithElementwiseNodesInPlace) {
  Options::global().set("disable_passes", "memory_plan");
  Session fresh(elementwise_chain());
  Options::global().reload();
  Session planned(elementwise_chain());
  for (int64_t rows : {100, 100, 3, 100, 3}) {  // the second run of each shape follows a plan
    Tensor x = input(rows, static_cast<float>(rows));
    EXPECT_EQ(values(planned.run({x})[0]), values(fresh.run({x})[0]));
  }
  EXPECT_EQ(fresh.memory_plan(), nullptr);
  const MemoryPlan* plan = planned.memory_plan();
  ASSERT_NE(plan, nullptr);
  EXPECT_EQ(plan->inplace, 3u);  // Mul, Sigmoid and Neg over their inputs (Exp's input is x)
  EXPECT_EQ(plan->arena_bytes, 3u * 64 * 4);
  EXPECT_EQ(plan->outside_bytes, 3u * 64 * 4);  // the result
}

// x -> Exp -> Neg, Neg's output the result: Neg writes it over Exp's output, which dies there, so
// that intermediate is allocated apart and becomes the result; results stay the fresh run's, and
// each run's result survives the next.
TEST_F(PlannedSession, AResultWrittenInPlaceTakesOverItsInput) {
  auto graph = [] {
    Graph g;
    g.name = "exp_neg";
    g.opset_imports[""] = 18;
    Value* x = g.add_input("x", {DType::kFloat32, SymShape{SymDim::symbol("n"), SymDim(64)}});
    Node* out = g.add_node("Neg", {g.add_op("Exp", {x})}, {"y"});
    g.add_output(out->outputs()[0]);
    return g;
  };
  Options::global().set("disable_passes", "memory_plan");
  Session fresh(graph());
  Options::global().reload();
  Session planned(graph());
  std::vector<Tensor> kept;
  std::vector<std::vector<float>> expect;
  for (int i = 0; i < 4; ++i) {
    Tensor x = input(100, static_cast<float>(i));
    kept.push_back(planned.run({x})[0]);
    expect.push_back(values(fresh.run({x})[0]));
    EXPECT_EQ(values(kept.back()), expect.back()) << "run " << i;
  }
  for (size_t i = 0; i < kept.size(); ++i) EXPECT_EQ(values(kept[i]), expect[i]) << "run " << i;
  const MemoryPlan* plan = planned.memory_plan();
  ASSERT_NE(plan, nullptr);
  EXPECT_EQ(plan->inplace, 1u);
  EXPECT_EQ(plan->arena_bytes, 0u);
  EXPECT_EQ(std::count(plan->takes.begin(), plan->takes.end(), 0), 1);
  // A planned run holds one buffer of 100 x 64 floats at most, not Exp's and the result's.
  Tensor x = input(100, 9.0f);
  const int64_t held = memory_stats().current_bytes;
  reset_peak_memory();
  Tensor y = planned.run({x})[0];
  EXPECT_EQ(memory_stats().peak_bytes - held, 100 * 64 * 4);
}

// A Shape reads no data: the session runs it right after its input's producer, so a Shape that
// the graph lists last (as autodiff adds them) does not keep that input's buffer alive, and the
// result still takes it over.
TEST_F(PlannedSession, AShapeReadDoesNotKeepABufferAlive) {
  Graph g;
  g.name = "shape_last";
  g.opset_imports[""] = 18;
  Value* x = g.add_input("x", {DType::kFloat32, SymShape{SymDim::symbol("n"), SymDim(64)}});
  Value* e = g.add_op("Exp", {x});
  Node* neg = g.add_node("Neg", {e}, {"y"});
  Node* shape = g.add_node("Shape", {e}, {"s"});  // inserted after Neg: sorted after it
  g.add_output(neg->outputs()[0]);
  g.add_output(shape->outputs()[0]);
  Session s(std::move(g));
  for (int i = 0; i < 2; ++i) {
    Tensor in = input(10, static_cast<float>(i));
    std::vector<Tensor> out = s.run({in});
    EXPECT_EQ(out[1].to_int64_vector(), (std::vector<int64_t>{10, 64}));
    for (int64_t k = 0; k < in.numel(); ++k)
      ASSERT_FLOAT_EQ(out[0].data<float>()[k], -std::exp(in.data<float>()[k]));
  }
  const MemoryPlan* plan = s.memory_plan();
  ASSERT_NE(plan, nullptr);
  EXPECT_EQ(plan->inplace, 1u);  // Neg's result over Exp's output
}

TEST_F(PlannedSession, ResultsOfOneRunSurviveTheNext) {
  Session s(elementwise_chain());
  std::vector<Tensor> kept;
  std::vector<std::vector<float>> expect;
  for (int i = 0; i < 4; ++i) {
    kept.push_back(s.run({input(50, static_cast<float>(i))})[0]);
    expect.push_back(values(kept.back()));
  }
  ASSERT_NE(s.memory_plan(), nullptr);
  for (size_t i = 0; i < kept.size(); ++i) EXPECT_EQ(values(kept[i]), expect[i]) << "run " << i;
}

TEST_F(PlannedSession, ATensorHandedToACallbackIsNeverReused) {
  // The host keeps the hook's input (Exp's output, an intermediate of the run) from the second
  // run on, which the recording run cannot see, and gives back a copy.
  std::vector<Tensor> held;
  int calls = 0;
  set_host_callback([&](const Node&, const std::vector<Tensor>& in) -> std::vector<Tensor> {
    if (calls++ > 0) held.push_back(in[0]);
    return {in[0].clone(), Tensor::scalar_int64(0)};
  });
  Graph g;
  g.name = "hooked";
  g.opset_imports[""] = 18;
  g.opset_imports[kGraphtrainDomain] = 1;
  Value* x = g.add_input("x", {DType::kFloat32, SymShape{SymDim::symbol("n"), SymDim(64)}});
  Value* e = g.add_op("Exp", {x});
  Node* hook = g.add_node("Hook", {e}, {"h", "ctx"}, kGraphtrainDomain);
  hook->attributes["module"] = Attribute::of(std::string("layer"));
  hook->attributes["kind"] = Attribute::of(std::string("post"));
  hook->attributes["num_passive"] = Attribute::of(int64_t{0});
  Value* t = g.add_op("Tanh", {hook->outputs()[0]});
  Node* out = g.add_node("Neg", {g.add_op("Sigmoid", {t})}, {"y"});
  g.add_output(out->outputs()[0]);
  Session s(std::move(g));
  std::vector<Tensor> xs;
  for (int i = 0; i < 4; ++i) {
    xs.push_back(input(40, static_cast<float>(i)));
    s.run({xs.back()});
  }
  ASSERT_EQ(held.size(), 3u);
  for (size_t i = 0; i < held.size(); ++i) {
    const Tensor& x = xs[i + 1];
    for (int64_t k = 0; k < x.numel(); ++k)
      ASSERT_FLOAT_EQ(held[i].data<float>()[k], std::exp(x.data<float>()[k])) << "run " << i + 1;
  }
  ASSERT_NE(s.memory_plan(), nullptr);
  EXPECT_GT(s.memory_plan()->inplace, 0u);  // Sigmoid over Tanh's output
}

TEST_F(PlannedSession, TrainingIsBitIdenticalWithAndWithoutPlans) {
  auto train = [](bool plan) {
    Options::global().set("disable_passes", plan ? "" : "memory_plan");
    TrainingConfig cfg;
    cfg.optimizer.lr = 0.05;
    TrainingSession ts(testing::mlp_with_loss(), cfg);
    std::vector<float> losses;
    for (int i = 0; i < 5; ++i) {
      std::vector<float> xs(6 * 4);
      for (size_t k = 0; k < xs.size(); ++k) xs[k] = std::cos(0.3f * static_cast<float>(k + i));
      std::map<std::string, Tensor> batch = {
          {"x", Tensor::from_vector(DType::kFloat32, {6, 4}, xs)},
          {"labels", Tensor::from_vector<int64_t>(DType::kInt64, {6}, {0, 1, 2, 0, 1, 2})}};
      ts.zero_grad();
      losses.push_back(ts.train_step(batch));
      ts.optimizer_step();
    }
    return losses;
  };
  EXPECT_EQ(train(true), train(false));
}

}  // namespace
}  // namespace graphtrain
