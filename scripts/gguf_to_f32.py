#!/usr/bin/env python3
"""A GGUF file with every tensor stored as F32: the same model, metadata and tensor order, only
the storage type changed (quantized and F16 tensors are dequantized by gguf-py).

llama.cpp runs a model in its file's types, so comparing its fp32 speed with socllm's (which
dequantizes at load) needs the file in F32 first (issue 16 item 6: "on the same file converted
to F32"). Used by scripts/bench_engine.py; the output is written to a temporary name and renamed.

    python scripts/gguf_to_f32.py SRC.gguf DST.gguf
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]

# Written by GGUFWriter itself (header fields, the architecture it is constructed with).
# general.file_type is rewritten (set if absent): the copy is all F32.
_WRITER_OWNED = {
    "GGUF.version",
    "GGUF.tensor_count",
    "GGUF.kv_count",
    "general.architecture",
    "general.file_type",
}
# llama.cpp's general.file_type value for "all F32" (LLAMA_FTYPE_ALL_F32 in llama.h).
_FILE_TYPE_ALL_F32 = 0


def gguf_to_f32(src: str | Path, dst: str | Path) -> Path:
    import gguf

    sys.path.insert(0, str(REPO / "python"))
    from socllm.errors import FormatError, MissingFileError
    from socllm.io.files import atomic_path

    src, dst = Path(src), Path(dst)
    if not src.is_file():
        raise MissingFileError(f"{src}: no such GGUF file")
    try:
        r = gguf.GGUFReader(str(src))
    except (ValueError, IndexError) as e:  # gguf-py's errors for a bad magic or a short file
        raise FormatError(f"{src}: not a readable GGUF file ({e})") from e
    arch_field = r.fields.get("general.architecture")
    if arch_field is None:
        raise FormatError(f"{src}: no general.architecture key; not a model GGUF")
    with atomic_path(dst) as tmp:
        w = gguf.GGUFWriter(str(tmp), arch_field.contents())
        for key, field in r.fields.items():
            if key in _WRITER_OWNED:
                continue
            vtype = field.types[0]
            if vtype == gguf.GGUFValueType.ARRAY:
                w.add_key_value(key, field.contents(), vtype, sub_type=field.types[-1])
            else:
                w.add_key_value(key, field.contents(), vtype)
        w.add_file_type(_FILE_TYPE_ALL_F32)
        for t in r.tensors:
            # gguf-py returns the tensor in numpy (row-major) order: the reverse of GGUF's.
            x = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
            w.add_tensor(t.name, np.ascontiguousarray(x.reshape(tuple(reversed(t.shape)))))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    return dst


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    args = ap.parse_args()
    print(gguf_to_f32(args.src, args.dst))
    return 0


if __name__ == "__main__":
    sys.exit(main())
