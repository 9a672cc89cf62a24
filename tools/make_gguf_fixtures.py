#!/usr/bin/env python3
# GGUF copies of fixtures/olmoe-tiny written by llama.cpp's own converter
# (convert_hf_to_gguf.py), for tests/gguf_reader.rs: the reader is checked
# against files the real writer produced, not only against our builder.
#
# Writes into fixtures/gguf/:
#   olmoe-tiny-f32.gguf                      --outtype f32
#   olmoe-tiny-q8_0.gguf                     --outtype q8_0 (norms and router stay F32)
#   olmoe-tiny-q8_0-split-0000N-of-00003.gguf  --outtype q8_0 --split-max-tensors 16
#
# Pinned versions (the committed files were produced with exactly these):
#   llama.cpp as vendored by llama-cpp-python 0.3.36 (gguf-py 0.19.0)
#   torch==2.9.1  transformers==4.57.1  safetensors==0.6.2  numpy==2.4.6
#   sentencepiece==0.2.3
# Run (CPU only; two runs give byte-identical files):
#   /work/bench-data/peers/venv/bin/python tools/make_gguf_fixtures.py \
#       /work/bench-data/peers/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp
#
# The fixture's tokenizer is a byte-level BPE that llama.cpp does not know by
# hash, so its pre-tokenizer check is answered with "gpt-2" (as
# /work/bench-data/peers/convert_wrapper.py does for the benchmarks); the
# model is random, the tokenizer only has to be self-consistent.
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SRC = os.path.join(REPO, "fixtures", "olmoe-tiny")
OUT = os.path.join(REPO, "fixtures", "gguf")

RUNNER = """
import sys
src = sys.argv.pop(1)
sys.path.insert(0, src + "/gguf-py")
sys.path.insert(0, src)
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
import convert_hf_to_gguf
convert_hf_to_gguf.main()
"""


def convert(llama_cpp, outfile, *extra):
    cmd = [sys.executable, "-c", RUNNER, llama_cpp, SRC, "--outfile", outfile, *extra]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    subprocess.run(cmd, check=True, env=env)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: make_gguf_fixtures.py <llama.cpp source dir>")
    llama_cpp = sys.argv[1]
    os.makedirs(OUT, exist_ok=True)
    convert(llama_cpp, os.path.join(OUT, "olmoe-tiny-f32.gguf"), "--outtype", "f32")
    convert(llama_cpp, os.path.join(OUT, "olmoe-tiny-q8_0.gguf"), "--outtype", "q8_0")
    # The converter names the shards <stem>-0000N-of-0000M.gguf.
    convert(
        llama_cpp,
        os.path.join(OUT, "olmoe-tiny-q8_0-split.gguf"),
        "--outtype", "q8_0", "--split-max-tensors", "16",
    )


if __name__ == "__main__":
    main()
