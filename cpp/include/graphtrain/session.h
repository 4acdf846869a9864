// Session: runs a graph (loaded from an .onnx file or built in memory). The plan is made once;
// run() may be called many times with inputs of the declared symbolic shapes.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "graphtrain/graph.h"
#include "graphtrain/memory_plan.h"
#include "graphtrain/tensor.h"

namespace graphtrain {

class ThreadPool;

struct SessionOptions {
  std::string device = "cpu";
  ThreadPool* pool = nullptr;  // nullptr: the global pool
};

class Session {
 public:
  explicit Session(const std::string& onnx_path, SessionOptions options = {});
  explicit Session(Graph graph, SessionOptions options = {});
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  const Graph& graph() const { return graph_; }
  std::vector<std::string> input_names() const;
  std::vector<std::string> output_names() const;

  // Inputs in the graph's input order. Throws InputError naming the input and what is wrong
  // (count, dtype, rank, a dim that differs from the declared one or from another input's).
  std::vector<Tensor> run(const std::vector<Tensor>& inputs);
  // The same, the run owning the inputs: each is released after the last step that reads it,
  // where the caller holds no other reference (a training forward's stash, freed while the
  // backward goes, so that its blocks serve the run's later allocations while still in cache).
  std::vector<Tensor> run(std::vector<Tensor>&& inputs);
  // Inputs by name; every graph input must be given, and no unknown name.
  std::vector<Tensor> run(const std::map<std::string, Tensor>& feeds);

  // The memory plan (graphtrain/memory_plan.h) for the input shapes of the latest run, made by
  // the first run with those shapes; nullptr before that or with memory planning off.
  const MemoryPlan* memory_plan() const;

  // Kernel timing: graphtrain/profiler.h (GRAPHTRAIN_PROFILE) records every run of every Session.

 private:
  struct Plan;
  Graph graph_;
  SessionOptions options_;
  std::unique_ptr<Plan> plan_;
};

}  // namespace graphtrain
