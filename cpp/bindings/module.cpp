// The module socllm._core: one init function per binding file (common.h), types before the
// functions whose signatures name them.
#include "common.h"

PYBIND11_MODULE(_core, m) {
  namespace b = socllm::py_bind;
  m.doc() = "socllm C++ core (see cpp/<folder>/*.h)";
  b::init_core(m);
  b::init_io(m);
  b::init_model(m);
  b::init_kernels(m);
  b::init_quant(m);
  pybind11::module_ sim =
      m.def_submodule("sim", "SoC profiles, cost models, task graphs, discrete-event simulation");
  b::init_soc(sim);
  b::init_sched(sim);
  b::init_attention(m);
  b::init_plan(m);
  b::init_calibration(m);
  b::init_block(m);
  b::init_engine(m);
  b::init_calibrate(m);
  b::init_sim(sim);
}
