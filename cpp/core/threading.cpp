#include <omp.h>

#include <atomic>

#include "socllm/core.h"

extern "C" {
void openblas_set_num_threads(int);
char* openblas_get_corename(void);
char* openblas_get_config(void);
}

namespace socllm {
namespace {
std::atomic<int> g_threads{0};
}

void set_num_threads(int n) {
  if (n < 1) throw InvalidArgument("[set_num_threads] need n >= 1, got " + std::to_string(n));
  g_threads = n;
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int num_threads() {
  if (g_threads == 0) set_num_threads(2);  // the brief's default: 2 threads
  return g_threads;
}

std::string blas_corename() { return openblas_get_corename(); }
std::string blas_config() { return openblas_get_config(); }

}  // namespace socllm
