// Trains a small MLP classifier from C++ alone with graphtrain::TrainingSession.
// The model is built with the IR API (it could equally be loaded from an .onnx file); the data is
// synthetic: the label of x is the argmax of x @ W for a hidden W.
#include <cstdio>
#include <random>

#include "graphtrain/graph.h"
#include "graphtrain/training_session.h"

using namespace graphtrain;

namespace {

Tensor random_tensor(std::mt19937& rng, Shape shape, float scale) {
  std::normal_distribution<float> n(0.0f, scale);
  Tensor t = Tensor::empty(DType::kFloat32, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = n(rng);
  return t;
}

// loss = cross_entropy(relu(x @ W1 + b1) @ W2 + b2, labels)
Graph mlp(std::mt19937& rng, int64_t in, int64_t hidden, int64_t classes) {
  Graph g;
  g.name = "mlp";
  g.opset_imports[""] = 18;
  Value* x = g.add_input("x", {DType::kFloat32, SymShape{SymDim::symbol("batch"), SymDim(in)}});
  Value* labels = g.add_input("labels", {DType::kInt64, SymShape{SymDim::symbol("batch")}});
  Value* w1 = g.add_initializer("fc1.weight", random_tensor(rng, {in, hidden}, 0.3f));
  Value* b1 = g.add_initializer("fc1.bias", Tensor::zeros(DType::kFloat32, {hidden}));
  Value* w2 = g.add_initializer("fc2.weight", random_tensor(rng, {hidden, classes}, 0.3f));
  Value* b2 = g.add_initializer("fc2.bias", Tensor::zeros(DType::kFloat32, {classes}));
  Value* h = g.add_op("Relu", {g.add_op("Gemm", {x, w1, b1})});
  Value* logits = g.add_op("Gemm", {h, w2, b2});
  Node* loss = g.add_node("SoftmaxCrossEntropyLoss", {logits, labels}, {"loss"});
  g.add_output(loss->outputs()[0]);
  return g;
}

}  // namespace

int main() {
  std::mt19937 rng(0);
  const int64_t in = 16, hidden = 64, classes = 4, batch = 64;
  Tensor teacher = random_tensor(rng, {in, classes}, 1.0f);
  auto make_batch = [&](std::map<std::string, Tensor>& feeds) {
    Tensor x = random_tensor(rng, {batch, in}, 1.0f);
    Tensor y = Tensor::empty(DType::kInt64, {batch});
    for (int64_t b = 0; b < batch; ++b) {
      int64_t best = 0;
      float best_v = -1e30f;
      for (int64_t c = 0; c < classes; ++c) {
        float v = 0;
        for (int64_t i = 0; i < in; ++i)
          v += x.data<float>()[b * in + i] * teacher.data<float>()[i * classes + c];
        if (v > best_v) best_v = v, best = c;
      }
      y.data<int64_t>()[b] = best;
    }
    feeds["x"] = x;
    feeds["labels"] = y;
  };

  TrainingConfig config;
  config.optimizer.kind = "adamw";
  config.optimizer.lr = 3e-3;
  TrainingSession session(mlp(rng, in, hidden, classes), config);
  std::printf("training %zu parameters of an MLP from C++\n", session.parameter_names().size());
  for (int step = 1; step <= 200; ++step) {
    std::map<std::string, Tensor> feeds;
    make_batch(feeds);
    session.zero_grad();
    float loss = session.train_step(feeds);
    session.optimizer_step();
    if (step == 1 || step % 25 == 0) std::printf("step %3d  loss %.4f\n", step, loss);
  }
  return 0;
}
