"""Files in and out: model files (docs/MODEL_FORMAT.md) converted from GGUF and Hugging Face
checkpoints (:mod:`socllm.io.convert`, :mod:`socllm.io.convert_packed`), their facts
(:mod:`socllm.io.model_format`), the GGUF reader and ggml dequantization of the C++ core, and
atomic writes (:mod:`socllm.io.files`).

- :class:`Model`: a socllm model file's weights (``Model.load(path)``; format versions).
- :class:`GgufFile`, :func:`dequantize`, :func:`dequantize_to_int8_rows`,
  :func:`ggml_type_name`, :func:`ggml_supported_types`: GGUF files as the core reads them.
"""

from .. import _core

Model = _core.Model
GgufFile = _core.GgufFile
dequantize = _core.dequantize
dequantize_to_int8_rows = _core.dequantize_to_int8_rows
ggml_type_name = _core.ggml_type_name
ggml_supported_types = _core.ggml_supported_types

__all__ = [
    "Model",
    "GgufFile",
    "dequantize",
    "dequantize_to_int8_rows",
    "ggml_type_name",
    "ggml_supported_types",
]
