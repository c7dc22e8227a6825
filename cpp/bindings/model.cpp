// Mirrors cpp/model/ (model.h, decoder_block.h): a model's config, fp32 or prequantized
// weights, and the facts of its decoder block.
#include <pybind11/stl.h>

#include <optional>

#include "common.h"
#include "model/decoder_block.h"
#include "model/model.h"
#include "quant/rotation.h"

namespace socllm::py_bind {

void init_model(py::module_& m) {
  m.def(
      "decoder_block",
      [](const py::object& config) {
        std::optional<ModelConfig> c;
        if (!config.is_none()) c = ModelConfig::from_json(py_to_json(config, "ModelConfig"));
        py::list l;
        const std::vector<BlockOpInfo> ops =
            c ? decoder_block(*c)
              : std::vector<BlockOpInfo>(all_block_ops().begin(), all_block_ops().end());
        for (const BlockOpInfo& op : ops) {
          py::dict d;
          d["name"] = op.name;
          d["op_class"] = op_class_name(op.op_class);
          d["subgraph"] = subgraph_kind_name(op.subgraph);
          d["site"] =
              op.site ? py::object(py::str(linear_site_name(*op.site))) : py::object(py::none());
          if (c) {
            d["in_width"] = op_in_width(*c, op.op);
            d["out_width"] = op_out_width(*c, op.op);
            if (op.site) {
              py::list tensors;
              for (const auto& f : fused_tensors(*c, *op.site)) {
                py::dict e;
                e["name"] = f.name;
                e["rows"] = f.rows;
                tensors.append(e);
              }
              d["tensors"] = tensors;
            }
          }
          l.append(d);
        }
        return l;
      },
      py::arg("config") = py::none(),
      "The ops of a decoder block in execution order (model/decoder_block.h): name, op_class, "
      "subgraph, site; for a config only its ops (Gemma 3's norms where it has them) with "
      "in_width, out_width and, for linears, the fused weight tensors (name in the model file, "
      "rows).");
  m.def(
      "op_classes",
      [] {
        std::vector<std::string> out;
        for (int i = 0; i < kNumOpClasses; ++i)
          out.emplace_back(op_class_name(static_cast<OpClass>(i)));
        return out;
      },
      "The op classes a plan places.");
  py::class_<Model, std::shared_ptr<Model>>(m, "Model", "fp32 weights of a llama-family model.")
      .def_static(
          "load",
          [](const std::string& path) {
            py::gil_scoped_release nogil;
            return std::const_pointer_cast<Model>(Model::load(path));
          },
          py::arg("path"), "Load a socllm HDF5 model file (docs/MODEL_FORMAT.md).")
      .def_property_readonly("config",
                             [](const Model& mdl) { return json_to_py(mdl.config().to_json()); })
      .def_static(
          "check_config",
          [](const py::handle& config) {
            const ModelConfig c = ModelConfig::from_json(py_to_json(config, "ModelConfig"));
            c.check_runnable();
            return json_to_py(c.to_json());
          },
          py::arg("config"),
          "The config Model.load would accept, normalized (defaults filled); InvalidArgumentError "
          "naming the value, UnsupportedError for what the engine cannot run.")
      .def_property_readonly_static("format_version",
                                    [](const py::object&) { return Model::kFormatVersion; })
      .def_property_readonly_static("oldest_format_version",
                                    [](const py::object&) { return Model::kOldestFormatVersion; })
      .def_property_readonly_static("checksum_format_version",
                                    [](const py::object&) { return Model::kChecksumFormatVersion; })
      .def_property_readonly_static(
          "attribute_checksum_format_version",
          [](const py::object&) { return Model::kAttributeChecksumFormatVersion; })
      .def(
          "rotated",
          [](std::shared_ptr<Model> mdl, const std::string& rotation) {
            const auto spec = quant::RotationSpec::from_name(rotation);
            py::gil_scoped_release nogil;
            return std::const_pointer_cast<Model>(quant::rotate_model(mdl, spec));
          },
          py::arg("rotation"),
          "The model rotated as a plan's rotation parts say (quant/rotation.h, issue 39; QuaRot's "
          "computational invariance): rotation is a rotation's name, its parts joined by ',': "
          "'hadamard,seed=N' (randomized Hadamard) or 'random,seed=N' (Haar orthogonal) rotates "
          "the residual stream, 'fold' only folds the RMSNorm gains into the linears (Q = I), "
          "'down' the down projection's input (online Hadamard), 'heads' every head's values; "
          "e.g. 'hadamard,seed=0,down'. The same function in fp32. UnsupportedError for a "
          "residual rotation of a model with post-linear norms (Gemma 3).")
      .def_property_readonly("rotation", &Model::rotation,
                             "The rotation the weights carry ('none' as loaded; rotated()).")
      .def_property_readonly("path", &Model::path)
      .def_property_readonly("weight_bytes", &Model::weight_bytes)
      .def_property_readonly(
          "packed_linears",
          [](const Model& mdl) -> py::object {
            const PackedModelLinears* pk = mdl.packed_linears();
            if (!pk) return py::none();
            py::dict d;
            d["plan"] = json_to_py(pk->plan);
            d["scheme"] = json_to_py(pk->scheme);
            d["group"] = pk->group;
            d["bytes_read"] = pk->bytes_read;
            d["read_seconds"] = pk->read_seconds;
            d["unpack_seconds"] = pk->unpack_seconds;
            return d;
          },
          "For a file of prequantized linears: the plan it was converted under, its scheme, the "
          "weightlet group, and what loading them cost (bytes_read, read_seconds, "
          "unpack_seconds); None otherwise.");
}

}  // namespace socllm::py_bind
