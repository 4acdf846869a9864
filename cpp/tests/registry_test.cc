// One op is one unit: the kernel, shape and gradient registries agree with each other and with
// what the gradient rules emit.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "graphtrain/autodiff.h"
#include "graphtrain/ops.h"

namespace graphtrain {
namespace {

std::set<std::string> as_set(const std::vector<std::string>& v) {
  return std::set<std::string>(v.begin(), v.end());
}

TEST(Registry, EveryKernelOpHasAShapeRule) {
  std::set<std::string> inferers = as_set(ops_with_shape_inferer());
  for (const std::string& op : registered_ops("cpu"))
    EXPECT_TRUE(inferers.count(op)) << op << " has a kernel but no shape inferer";
}

TEST(Registry, EveryOpWithAGradientRuleHasAKernel) {
  std::set<std::string> kernels = as_set(registered_ops("cpu"));
  for (const std::string& op : ops_with_gradient())
    EXPECT_TRUE(kernels.count(op)) << op << " has a gradient rule but no kernel";
}

// The gradient rules name the ops they emit as string literals: c.op("Mul", ...),
// c.op_n("ConvGrad", ..., GT) and through_host(c, "HookGrad", ...). Each must have a kernel.
TEST(Registry, EveryOpAGradientRuleEmitsHasAKernel) {
  std::set<std::string> kernels = as_set(registered_ops("cpu"));
  std::filesystem::path dir = std::filesystem::path(GRAPHTRAIN_SOURCE_DIR) / "src" / "autodiff";
  std::regex emit(R"re((?:\bop\(|\bop_n\(|through_host\(c,)\s*"([A-Z][A-Za-z]*)")re");
  size_t found = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".cc" || entry.path().filename() == "builder.cc") continue;
    std::ifstream in(entry.path());
    std::stringstream text;
    text << in.rdbuf();
    std::string src = text.str();
    for (std::sregex_iterator it(src.begin(), src.end(), emit), end; it != end; ++it) {
      std::string op = (*it)[1];
      EXPECT_TRUE(kernels.count(op) || kernels.count("graphtrain::" + op))
          << entry.path().filename() << " emits " << op << ", which has no kernel";
      ++found;
    }
  }
  EXPECT_GT(found, 50u);  // the scan itself works
}

}  // namespace
}  // namespace graphtrain
