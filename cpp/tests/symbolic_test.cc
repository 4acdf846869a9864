#include <gtest/gtest.h>

#include "graphtrain/symbolic.h"

namespace graphtrain {
namespace {

TEST(SymDim, CanonicalFormMakesEqualExpressionsEqual) {
  SymDim b = SymDim::symbol("batch"), s = SymDim::symbol("seq");
  EXPECT_EQ(b * s, s * b);
  EXPECT_EQ((s + 1) - 1, s);
  EXPECT_EQ(b * SymDim(2) + b, b * SymDim(3));
  EXPECT_NE(b, s);
  EXPECT_EQ((b * s).to_string(), "batch*seq");
  EXPECT_EQ((s + 1).to_string(), "seq + 1");
  EXPECT_EQ((b * 4 - 2).to_string(), "4*batch - 2");
}

TEST(SymDim, ExactDivision) {
  SymDim b = SymDim::symbol("batch"), s = SymDim::symbol("seq");
  EXPECT_EQ(*(b * s * 64).exact_div(SymDim(8)), b * s * 8);
  EXPECT_EQ(*(b * s * 64).exact_div(s * 4), b * 16);
  EXPECT_FALSE((b * 3).exact_div(SymDim(2)));
  EXPECT_FALSE(b.exact_div(s));
  EXPECT_FALSE(b.exact_div(SymDim(0)));
  EXPECT_EQ(*(b + s).exact_div(b + s), SymDim(1));
}

TEST(SymDim, ParseAndEvaluate) {
  EXPECT_EQ(SymDim::parse("batch*seq"), SymDim::symbol("batch") * SymDim::symbol("seq"));
  EXPECT_EQ(SymDim::parse("seq + 1"), SymDim::symbol("seq") + 1);
  EXPECT_EQ(SymDim::parse("12"), SymDim(12));
  EXPECT_TRUE(SymDim::parse("weird-name!").is_symbol());
  std::map<std::string, int64_t> bind{{"batch", 3}, {"seq", 5}};
  EXPECT_EQ(SymDim::parse("2*batch*seq + 1").evaluate(bind), 31);
  EXPECT_FALSE(SymDim::parse("heads").evaluate(bind));
  EXPECT_NE(SymDim::fresh(), SymDim::fresh());
}

}  // namespace
}  // namespace graphtrain
