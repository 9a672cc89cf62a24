#!/usr/bin/env python3
"""Regenerates fixtures/ggml-kernels/*.bin from ggml itself.

Pinned versions (what the committed fixtures were made with):
  - ggml 0.25.3 as vendored by llama_cpp_python 0.3.36 (the sources under
    vendor/llama.cpp/ggml), built as libggml-base.so / libggml-cpu.so with
    GGML_NATIVE=OFF and AVX, AVX2, AVX-512 (F, BW, VBMI, VNNI, BF16),
    AVX-VNNI, F16C, FMA enabled (CMAKE_BUILD_TYPE=Release);
  - gcc (any C11 compiler) for tools/ggml_kernel_fixtures.c;
  - numpy and gguf-py from the same llama.cpp tree, only for the second,
    independent check of the dequantized values (gguf-py's quants.py).

Usage:
  make_ggml_kernel_fixtures.py GGML_BUILD_BIN GGML_INCLUDE GGUF_PY [OUT_DIR]

The C harness does the work through ggml's public API
(`ggml_quantize_chunk`, `ggml_get_type_traits(t)->to_float`,
`ggml_get_type_traits_cpu(t)->from_float / vec_dot`); the file layout is in
fixtures/README.md ("ggml-kernels").
"""

import os
import struct
import subprocess
import sys
import tempfile

TYPES = ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q2_K", "q3_K", "q4_K",
         "q5_K", "q6_K", "iq4_nl", "iq4_xs", "mxfp4"]


def build_and_run(bin_dir, include, out_dir):
    here = os.path.dirname(os.path.abspath(__file__))
    src = os.path.join(here, "ggml_kernel_fixtures.c")
    with tempfile.TemporaryDirectory() as tmp:
        exe = os.path.join(tmp, "ggml_kernel_fixtures")
        subprocess.run(["gcc", "-O2", "-Wall", "-o", exe, src, "-I", include,
                        "-L", bin_dir, "-lggml-cpu", "-lggml-base", "-lm",
                        "-Wl,-rpath," + bin_dir], check=True)
        subprocess.run([exe, out_dir], check=True)


def read_cases(path):
    """Yields (type id, cols, block bytes, dequantized f32 bytes)."""
    import gguf  # noqa: F401  (imported for the type table)
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
    data = open(path, "rb").read()
    magic, version, ty, aty, ncases = struct.unpack_from("<4sIIII", data, 0)
    assert magic == b"GGKF" and version == 1, path
    bs, ts = GGML_QUANT_SIZES[GGMLQuantizationType(ty)]
    abs_, ats = GGML_QUANT_SIZES[GGMLQuantizationType(aty)]
    off = 20
    for _ in range(ncases):
        (cols,) = struct.unpack_from("<I", data, off)
        off += 4
        wb = cols // bs * ts
        blocks = data[off:off + wb]
        off += wb
        deq = data[off:off + 4 * cols]
        off += 4 * cols + 4 * cols + cols // abs_ * ats + 4
        yield ty, cols, blocks, deq
    assert off == len(data), path


def check_with_gguf_py(out_dir, gguf_py):
    """Second reference: gguf-py's numpy dequantizers must agree bit for bit
    with ggml's `to_float` on every fixture row."""
    sys.path.insert(0, gguf_py)
    import numpy as np
    from gguf import quants
    from gguf.constants import GGMLQuantizationType
    for name in TYPES:
        for ty, cols, blocks, deq in read_cases(os.path.join(out_dir, name + ".bin")):
            qt = GGMLQuantizationType(ty)
            arr = np.frombuffer(blocks, dtype=np.uint8).reshape(1, -1)
            try:
                ours = quants.dequantize(arr, qt).astype(np.float32).reshape(-1)
            except NotImplementedError:
                print(f"{name}: gguf-py has no dequantizer, skipped")
                break
            ref = np.frombuffer(deq, dtype=np.float32)
            same = np.array_equal(ours.view(np.uint32), ref.view(np.uint32))
            print(f"{name} ({cols} cols): gguf-py {'equals' if same else 'DIFFERS FROM'} ggml")


def main():
    if len(sys.argv) not in (4, 5):
        sys.exit(__doc__)
    bin_dir, include, gguf_py = sys.argv[1:4]
    here = os.path.dirname(os.path.abspath(__file__))
    out_dir = sys.argv[4] if len(sys.argv) == 5 else os.path.join(here, "..", "fixtures", "ggml-kernels")
    os.makedirs(out_dir, exist_ok=True)
    build_and_run(bin_dir, include, out_dir)
    check_with_gguf_py(out_dir, gguf_py)


if __name__ == "__main__":
    main()
