#!/usr/bin/env python3
# Quantization quality, colibri's formats beside llama.cpp's, on the same
# checkpoint and the same text: each engine's quantized model against that
# engine's own f32 copy of the checkpoint, teacher-forced, as top-1
# agreement and the mean KL divergence of the next-token distribution.
#
#   colibri:   `coli convert --experts E --dense D` for E in int8, int4-g32,
#              int4-g64, int4 (one scale per row), int2; then `coli quality
#              --reference <checkpoint> --text T --window W` (default engine
#              flags: int8 activations, f16 KV cache; scores every position
#              of each window), on the token ids llama-tokenize gives for T.
#   llama.cpp: convert_hf_to_gguf.py --outtype f32, llama-quantize to Q8_0,
#              Q4_0 and Q4_K_M, then llama-perplexity --kl-divergence-base
#              on the f32 file and --kl-divergence on each quant (-c W; it
#              scores the second half of each window).
#
# Pinned versions: llama.cpp as vendored by llama-cpp-python 0.3.36 (ggml
# 0.25.3, gguf-py 0.19.0), built with -DGGML_NATIVE=ON; torch==2.9.1,
# transformers==4.57.1 for the converter; Python 3.11 standard library here.
#
# Run:
#   /work/bench-data/peers/venv/bin/python tools/peers/quality.py \
#       --checkpoint models/colibri-tiny --text fixtures/quality/wordnet-heldout.txt
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))
# The converter runner the GGUF fixtures are made with (its pre-tokenizer
# answer explained there).
from make_gguf_fixtures import RUNNER  # noqa: E402
COLI_FORMATS = ["int8", "int4-g32", "int4-g64", "int4", "int2"]
LLAMA_TYPES = ["Q8_0", "Q4_0", "Q4_K_M"]


def run(cmd, **kw):
    return subprocess.run([str(c) for c in cmd], check=True, capture_output=True, text=True, **kw)


def llama_ids(a, work, f32):
    """The text as llama-perplexity reads it (llama-tokenize with the same
    defaults: no special-token parsing), for coli to read the same ids."""
    r = run([a.llama_bin / "llama-tokenize", "-m", f32, "-f", a.text, "--ids", "--no-parse-special", "--log-disable"])
    ids = json.loads(r.stdout.strip().splitlines()[-1])
    path = work / "ids.txt"
    path.write_text(",".join(map(str, ids)))
    return path, len(ids)


def coli_rows(a, work, ids):
    rows = []
    for e in COLI_FORMATS:
        out = work / f"coli-{e}-{a.dense}"
        if not out.exists():
            run([a.coli, "convert", "--input", a.checkpoint, "--output", out, "--experts", e, "--dense", a.dense])
        r = run([a.coli, "quality", "--model", out, "--reference", a.checkpoint, "--ids", ids,
                 "--window", a.window, "--max-positions", "1000000", "--json", "--threads", a.threads])
        q = json.loads(r.stdout)
        rows.append((f"coli {e} (dense {a.dense})", q["top1_agree"] / q["positions"], q["mean_kl"],
                     f"{q['positions']}, every position"))
    return rows


def llama_f32(a, work):
    f32 = work / "f32.gguf"
    if not f32.exists():
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
        run([sys.executable, "-c", RUNNER, a.llama_src, a.checkpoint, "--outfile", f32, "--outtype", "f32"], env=env)
    return f32


def llama_rows(a, work, f32):
    base = work / "f32.kld"
    ppl = [a.llama_bin / "llama-perplexity", "-f", a.text, "-c", a.window, "-t", a.threads, "-b", a.window]
    run([*ppl, "-m", f32, "--kl-divergence-base", base])
    rows = []
    for t in LLAMA_TYPES:
        q = work / f"{t}.gguf"
        if not q.exists():
            run([a.llama_bin / "llama-quantize", f32, q, t])
        # llama.cpp logs through a background thread; read stdout and stderr
        # as one stream, and run again if the summary was lost at exit.
        for _ in range(5):
            r = subprocess.run([str(c) for c in [*ppl, "-m", q, "--kl-divergence-base", base, "--kl-divergence"]],
                               check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            log = r.stdout
            kld = re.search(r"Mean\s+KLD:\s+([-0-9.e]+)", log)
            top = re.search(r"Same top p:\s+([0-9.]+)", log)
            if kld and top:
                break
        n = re.search(r"computing over (\d+) chunks", log)
        if not (kld and top):
            raise RuntimeError(f"llama-perplexity printed no KLD for {t}:\n{log[-3000:]}")
        rows.append((f"llama.cpp {t}", float(top.group(1)) / 100, float(kld.group(1)),
                     f"{n.group(1)} windows, second halves" if n else "?"))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", type=Path, required=True, help="HF f32/bf16 checkpoint directory")
    ap.add_argument("--text", type=Path, default=REPO / "fixtures" / "quality" / "wordnet-heldout.txt")
    ap.add_argument("--coli", type=Path, default=REPO / "target" / "release" / "coli")
    ap.add_argument("--dense", default="int8", help="coli's dense format for every row")
    ap.add_argument("--window", default="512")
    ap.add_argument("--threads", default="2")
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--llama-src", type=Path,
                    default=Path("/work/bench-data/peers/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp"))
    ap.add_argument("--llama-bin", type=Path, default=Path("/work/bench-data/peers/llama-server-build/bin"))
    a = ap.parse_args()
    work = a.work or Path(tempfile.mkdtemp(prefix="coli-quality-"))
    work.mkdir(parents=True, exist_ok=True)
    f32 = llama_f32(a, work)
    ids, n = llama_ids(a, work, f32)
    rows = coli_rows(a, work, ids) + llama_rows(a, work, f32)
    print(f"checkpoint {a.checkpoint}, text {a.text} ({n} tokens as llama.cpp reads it, given to coli as ids), "
          f"window {a.window}")
    print("| model | top-1 agreement with its engine's f32 | mean KL (nats) | positions |")
    print("|---|---|---|---|")
    for name, agree, kl, pos in rows:
        print(f"| {name} | {agree * 100:.1f}% | {kl:.5f} | {pos} |")


if __name__ == "__main__":
    main()
