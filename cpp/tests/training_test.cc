#include <gtest/gtest.h>

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
