// Plans, configs and caches: validation and typed errors.
#include <gtest/gtest.h>

#include "engine/engine.h"

using namespace socllm;

TEST(Plan, KnownAndUnknown) {
  EXPECT_EQ(Plan::from_name("fp32").name, "fp32");
  EXPECT_EQ(Plan::from_json({{"name", "fp32"}}).to_json()["name"], "fp32");
  EXPECT_THROW(Plan::from_name("int3"), InvalidArgument);
  EXPECT_THROW(Plan::from_json({{"name", "fp32"}, {"bogus", 1}}), InvalidArgument);
  EXPECT_THROW(Plan::from_json(nlohmann::json::array()), InvalidArgument);
}

TEST(ModelConfig, Validation) {
  nlohmann::json j = {{"arch", "llama"}, {"vocab_size", 10},    {"d_model", 8},
                      {"n_layers", 1},   {"n_heads", 2},        {"n_kv_heads", 1},
                      {"d_ff", 16},      {"context_length", 32}};
  ModelConfig c = ModelConfig::from_json(j);
  EXPECT_EQ(c.head_dim, 4);
  EXPECT_EQ(c.kv_dim(), 4);
  auto bad = j;
  bad["arch"] = "gpt-neo";  // a shape-only config of another architecture: timed, not run
  EXPECT_NO_THROW(ModelConfig::from_json(bad));
  EXPECT_THROW(ModelConfig::from_json(bad).check_runnable(), Unsupported);
  EXPECT_NO_THROW(c.check_runnable());
  bad["mlp"] = "plain";
  EXPECT_EQ(ModelConfig::from_json(bad).mlp_in_dim(), 16);
  EXPECT_EQ(ModelConfig::from_json(bad).to_json()["mlp"], "plain");
  bad["mlp"] = "moe";
  EXPECT_THROW(ModelConfig::from_json(bad), InvalidArgument);
  bad = j;
  bad["n_kv_heads"] = 3;
  EXPECT_THROW(ModelConfig::from_json(bad), InvalidArgument);
  bad = j;
  bad.erase("d_ff");
  EXPECT_THROW(ModelConfig::from_json(bad), InvalidArgument);
}

TEST(KVCache, SizeAndBadCapacity) {
  ModelConfig c = ModelConfig::from_json({{"arch", "llama"},
                                          {"vocab_size", 10},
                                          {"d_model", 8},
                                          {"n_layers", 3},
                                          {"n_heads", 2},
                                          {"n_kv_heads", 1},
                                          {"d_ff", 16},
                                          {"context_length", 32}});
  KVCache kv(c, 5);
  EXPECT_EQ(kv.bytes(), 2 * 3 * 5 * 4 * 4);
  EXPECT_THROW(KVCache(c, 0), InvalidArgument);
}
