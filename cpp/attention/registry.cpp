// The attention schemes a plan can name. A scheme is one file defining `const SchemeKind&
// <name>()`, plus one line below; its order here is the order listed to users.
#include "attention/attention_scheme.h"

#define SOCLLM_ATTENTION_SCHEMES(X)             \
  X(fp32_scheme)         /* fp32.cpp */         \
  X(sparse_scheme)       /* sparse.cpp */       \
  X(block_sparse_scheme) /* block_sparse.cpp */ \
  X(npu_int8_scheme)     /* npu_int8.cpp */     \
  X(shadow_attn_scheme)  /* shadow_attn.cpp */

namespace socllm::attention {

#define SOCLLM_DECLARE(f) const SchemeKind& f();
SOCLLM_ATTENTION_SCHEMES(SOCLLM_DECLARE)
#undef SOCLLM_DECLARE

std::span<const SchemeKind* const> schemes() {
#define SOCLLM_ENTRY(f) &f(),
  static const SchemeKind* const kSchemes[] = {SOCLLM_ATTENTION_SCHEMES(SOCLLM_ENTRY)};
#undef SOCLLM_ENTRY
  return kSchemes;
}

}  // namespace socllm::attention
