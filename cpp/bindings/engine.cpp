// Mirrors cpp/include/socllm/model.h and engine.h.
#include <pybind11/stl.h>

#include "common.h"
#include "socllm/engine.h"
#include "socllm/model.h"

namespace socllm::py_bind {

namespace {

Plan plan_from_py(const py::handle& p) {
  if (py::isinstance<Plan>(p)) return p.cast<Plan>();
  if (py::isinstance<py::str>(p)) return Plan::from_name(p.cast<std::string>());
  if (py::isinstance<py::dict>(p)) return Plan::from_json(py_to_json(p));
  throw InvalidArgument("[Plan] a plan is a name, a dict or a Plan, got " +
                        std::string(py::str(py::type::of(p).attr("__name__"))) +
                        " " + Plan::known_list());
}

std::vector<std::vector<int32_t>> to_batch(const py::handle& seqs, const char* fn) {
  std::vector<std::vector<int32_t>> out;
  for (py::handle s : py::iter(seqs)) out.push_back(to_token_ids(s, fn));
  if (out.empty()) throw InvalidArgument(std::string("[") + fn + "] no sequences given");
  return out;
}

}  // namespace

void init_engine(py::module_& m) {
  py::class_<Model, std::shared_ptr<Model>>(m, "Model", "fp32 weights of a llama-family model.")
      .def_static("load", [](const std::string& path) {
        py::gil_scoped_release nogil;
        return std::const_pointer_cast<Model>(Model::load(path));
      }, py::arg("path"), "Load a socllm HDF5 model file (docs/MODEL_FORMAT.md).")
      .def_property_readonly("config", [](const Model& mdl) { return json_to_py(mdl.config().to_json()); })
      .def_property_readonly("path", &Model::path)
      .def_property_readonly("weight_bytes", &Model::weight_bytes);

  py::class_<Plan>(m, "Plan", "How each operator class runs. Build from a name or a dict.")
      .def(py::init([](const py::handle& p) { return plan_from_py(p); }), py::arg("plan"))
      .def_readonly("name", &Plan::name)
      .def("to_json", [](const Plan& p) { return json_to_py(p.to_json()); })
      .def_static("known", &Plan::known)
      .def_static("describe", &Plan::describe, py::arg("name"))
      .def("__repr__", [](const Plan& p) { return "Plan('" + p.name + "')"; });

  py::class_<KVCache>(m, "KVCache", "Key/value cache of one sequence.")
      .def_property_readonly("length", &KVCache::length)
      .def_property_readonly("capacity", &KVCache::capacity)
      .def_property_readonly("bytes", &KVCache::bytes)
      .def("clear", &KVCache::clear);

  py::class_<Engine>(m, "Engine", "Runs a Model on token sequences under a Plan.")
      .def(py::init([](std::shared_ptr<Model> mdl) { return std::make_unique<Engine>(mdl); }),
           py::arg("model"))
      .def("new_cache", &Engine::new_cache, py::arg("capacity") = 0)
      .def("logits",
           [](const Engine& e, const py::handle& seqs, const py::handle& plan) {
             auto batch = to_batch(seqs, "Engine.logits");
             Plan p = plan_from_py(plan);
             std::vector<TensorF32> out;
             {
               py::gil_scoped_release nogil;
               out = e.logits(batch, p);
             }
             py::list l;
             for (auto& t : out) l.append(to_numpy(std::move(t)));
             return l;
           },
           py::arg("seqs"), py::arg("plan") = "fp32",
           "Logits [T_i, vocab] float32 for every position of each sequence (fresh context).")
      .def("step",
           [](const Engine& e, KVCache& cache, const py::handle& tokens, bool all_positions,
              const py::handle& plan) {
             auto ids = to_token_ids(tokens, "Engine.step");
             Plan p = plan_from_py(plan);
             TensorF32 out;
             {
               py::gil_scoped_release nogil;
               out = e.step(cache, ids, all_positions, p);
             }
             return to_numpy(std::move(out));
           },
           py::arg("cache"), py::arg("tokens"), py::arg("all_positions") = false,
           py::arg("plan") = "fp32")
      .def("token_logprobs",
           [](const Engine& e, const py::handle& seqs, const py::handle& plan) {
             auto batch = to_batch(seqs, "Engine.token_logprobs");
             Plan p = plan_from_py(plan);
             std::vector<std::vector<float>> out;
             {
               py::gil_scoped_release nogil;
               out = e.token_logprobs(batch, p);
             }
             py::list l;
             for (auto& v : out) {
               TensorF32 t({static_cast<int64_t>(v.size())});
               t.data = std::move(v);
               l.append(to_numpy(std::move(t)));
             }
             return l;
           },
           py::arg("seqs"), py::arg("plan") = "fp32",
           "log p(x_t | x_<t) for t = 1..T-1 of each sequence, float32 arrays.")
      .def("generate_greedy",
           [](const Engine& e, const py::handle& prompt, int64_t max_new_tokens,
              const std::vector<int32_t>& stop_ids, const py::handle& plan) {
             auto ids = to_token_ids(prompt, "Engine.generate");
             Plan p = plan_from_py(plan);
             py::gil_scoped_release nogil;
             return e.generate_greedy(ids, max_new_tokens, stop_ids, p);
           },
           py::arg("prompt"), py::arg("max_new_tokens"), py::arg("stop_ids") = std::vector<int32_t>{},
           py::arg("plan") = "fp32");
}

}  // namespace socllm::py_bind
