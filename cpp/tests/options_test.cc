#include <gtest/gtest.h>

#include <map>
#include <string>

#include "graphtrain/error.h"
#include "graphtrain/options.h"

namespace graphtrain {
namespace {

std::map<std::string, std::string> g_env;

const char* fake_getenv(const char* name) {
  auto it = g_env.find(name);
  return it == g_env.end() ? nullptr : it->second.c_str();
}

class OptionsTest : public ::testing::Test {
 protected:
  void SetUp() override { g_env.clear(); }
  Options make() { return Options(Options::builtin_specs(), &fake_getenv); }
};

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const OptionError& e) {
    return e.what();
  }
  return "";
}

TEST_F(OptionsTest, DefaultsHaveDefaultSource) {
  Options o = make();
  EXPECT_EQ(o.get_string("log_level"), "WARNING");
  EXPECT_EQ(o.get_int("num_threads"), 0);
  EXPECT_TRUE(o.get_bool("enable_compute_optimizer"));
  EXPECT_FALSE(o.get_bool("enable_zero_stage3"));
  EXPECT_EQ(o.get_string("fallback_policy"), "ATEN");
  for (const auto& v : o.values()) EXPECT_EQ(v.source, OptionSource::kDefault) << v.spec->name;
}

TEST_F(OptionsTest, DesignOptionsAllExist) {
  Options o = make();
  for (const char* env :
       {"GRAPHTRAIN_LOG_LEVEL", "GRAPHTRAIN_CACHE_DIR", "GRAPHTRAIN_FALLBACK_POLICY",
        "GRAPHTRAIN_ENABLE_CUSTOM_AUTOGRAD", "GRAPHTRAIN_ENABLE_COMPUTE_OPTIMIZER",
        "GRAPHTRAIN_SAVE_ONNX_PATH", "GRAPHTRAIN_NUM_THREADS", "GRAPHTRAIN_ENABLE_ZERO_STAGE3",
        "GRAPHTRAIN_PRINT_MEMORY_STATS"})
    EXPECT_NO_THROW(o.get(env)) << env;
}

TEST_F(OptionsTest, EnvironmentOverridesDefaultAndApiOverridesEnvironment) {
  g_env["GRAPHTRAIN_LOG_LEVEL"] = "info";
  g_env["GRAPHTRAIN_NUM_THREADS"] = " 3 ";
  Options o = make();
  EXPECT_EQ(o.get_string("log_level"), "INFO");
  EXPECT_EQ(o.get("log_level").source, OptionSource::kEnv);
  EXPECT_EQ(o.get_int("num_threads"), 3);
  o.set("log_level", "ERROR");
  EXPECT_EQ(o.get_string("log_level"), "ERROR");
  EXPECT_EQ(o.get("log_level").source, OptionSource::kApi);
  o.reload();  // API settings are forgotten, the environment is read again
  EXPECT_EQ(o.get_string("log_level"), "INFO");
  EXPECT_EQ(o.get("log_level").source, OptionSource::kEnv);
}

TEST_F(OptionsTest, BooleansAcceptOnlyZeroOneTrueFalseInAnyCase) {
  Options o = make();
  for (const char* yes : {"1", "true", "TRUE", "True"}) {
    o.set("enable_zero_stage3", yes);
    EXPECT_TRUE(o.get_bool("enable_zero_stage3")) << yes;
  }
  for (const char* no : {"0", "false", "FaLsE"}) {
    o.set("enable_zero_stage3", no);
    EXPECT_FALSE(o.get_bool("enable_zero_stage3")) << no;
  }
  for (const char* bad : {"yes", "on", "2", ""})
    EXPECT_THROW(o.set("enable_zero_stage3", bad), OptionError) << bad;
}

TEST_F(OptionsTest, BadEnumNamesVariableValueAndAcceptedValues) {
  g_env["GRAPHTRAIN_LOG_LEVEL"] = "LOUD";
  std::string msg = error_of([&] { make(); });
  EXPECT_NE(msg.find("GRAPHTRAIN_LOG_LEVEL"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'LOUD'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("VERBOSE, DEVINFO, INFO, WARNING, ERROR, FATAL"), std::string::npos) << msg;
}

TEST_F(OptionsTest, NegativeThreadCountIsRejectedWithTheRange) {
  g_env["GRAPHTRAIN_NUM_THREADS"] = "-3";
  std::string msg = error_of([&] { make(); });
  EXPECT_NE(msg.find("GRAPHTRAIN_NUM_THREADS='-3'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("an integer from 0 to"), std::string::npos) << msg;
  g_env["GRAPHTRAIN_NUM_THREADS"] = "4x";
  EXPECT_THROW(make(), OptionError);
}

TEST_F(OptionsTest, ReloadWithABadValueLeavesTheRegistryIntact) {
  g_env["GRAPHTRAIN_NUM_THREADS"] = "2";
  Options o = make();
  g_env["GRAPHTRAIN_NUM_THREADS"] = "many";
  EXPECT_THROW(o.reload(), OptionError);
  EXPECT_EQ(o.get_int("num_threads"), 2);
}

TEST_F(OptionsTest, UnknownNameAndWrongTypeAreClearErrors) {
  Options o = make();
  std::string msg = error_of([&] { o.get("log_levle"); });
  EXPECT_NE(msg.find("log_levle"), std::string::npos);
  EXPECT_NE(msg.find("log_level"), std::string::npos);
  EXPECT_THROW(o.get_int("log_level"), OptionError);
  EXPECT_THROW(o.get_string("num_threads"), OptionError);
}

TEST_F(OptionsTest, PathsExpandHome) {
  Options o = make();
  o.set("cache_dir", "~/gt-cache");
  const char* home = std::getenv("HOME");
  if (home) {
    EXPECT_EQ(o.get_string("cache_dir"), std::string(home) + "/gt-cache");
  }
}

int g_notified = 0;
TEST_F(OptionsTest, ListenersSeeChanges) {
  Options o = make();
  g_notified = 0;
  o.add_listener([](const OptionValue& v) {
    if (v.spec->name == "num_threads" && v.value == "7") ++g_notified;
  });
  o.set("num_threads", "7");
  EXPECT_EQ(g_notified, 1);
}

}  // namespace
}  // namespace graphtrain
