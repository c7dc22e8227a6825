// Test helper: a tiny shape-only Llama config (2 layers, 4 query / 2 KV heads of 16) for task
// graph and timing tests.
#pragma once

#include "model/model.h"

inline socllm::ModelConfig small_llama_config() {
  return socllm::ModelConfig::from_json({{"arch", "llama"},
                                         {"vocab_size", 100},
                                         {"d_model", 64},
                                         {"n_layers", 2},
                                         {"n_heads", 4},
                                         {"n_kv_heads", 2},
                                         {"head_dim", 16},
                                         {"d_ff", 128},
                                         {"context_length", 256}});
}
