#include "common.h"

PYBIND11_MODULE(_core, m) {
  m.doc() = "socllm C++ core (see cpp/include/socllm/*.h)";
  socllm::py_bind::init_core(m);
  socllm::py_bind::init_io(m);
  socllm::py_bind::init_engine(m);
  socllm::py_bind::init_ops(m);
  socllm::py_bind::init_quant(m);
  socllm::py_bind::init_sim(m);
}
