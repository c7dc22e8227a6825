"""Files in and out: model files (docs/MODEL_FORMAT.md) converted from GGUF and Hugging Face
checkpoints (:mod:`socllm.io.convert`, :mod:`socllm.io.convert_packed`), their facts
(:mod:`socllm.io.model_format`), the GGUF reader and ggml dequantization of the C++ core, and
atomic writes (:mod:`socllm.io.files`).

- :class:`Model`: a socllm model file's weights (``Model.load(path)``; format versions).
- :class:`GgufFile`, :func:`dequantize`, :func:`dequantize_to_int8_rows`,
  :func:`ggml_type_name`, :func:`ggml_supported_types`: GGUF files as the core reads them.
- :func:`seal_h5_attributes`, :func:`verify_h5_attributes`, :func:`h5_canonical_attributes`,
  :data:`H5_ATTRIBUTES_CHECKSUM`: the attribute checksums of HDF5 files (MODEL_FORMAT.md).
"""

from .. import _core

Model = _core.Model
GgufFile = _core.GgufFile
dequantize = _core.dequantize
dequantize_to_int8_rows = _core.dequantize_to_int8_rows
ggml_type_name = _core.ggml_type_name
ggml_supported_types = _core.ggml_supported_types
seal_h5_attributes = _core.seal_h5_attributes
verify_h5_attributes = _core.verify_h5_attributes
h5_canonical_attributes = _core.h5_canonical_attributes
H5_ATTRIBUTES_CHECKSUM = _core.H5_ATTRIBUTES_CHECKSUM

__all__ = [
    "Model",
    "GgufFile",
    "dequantize",
    "dequantize_to_int8_rows",
    "ggml_type_name",
    "ggml_supported_types",
    "seal_h5_attributes",
    "verify_h5_attributes",
    "h5_canonical_attributes",
    "H5_ATTRIBUTES_CHECKSUM",
]
