#!/usr/bin/env python3
# Peer comparison: colibri (`coli`) against llama.cpp on the same box, the
# same random-weight OLMoE-1B-7B-shaped checkpoint, the same tokens.
#
# Not run in CI (it builds llama.cpp from source and writes ~50 GB). See
# tools/peers/README.md for what each step does and docs/benchmarks.md for
# figures.
#
# Pinned versions (the figures in docs/benchmarks.md were produced with these):
#   llama-cpp-python==0.3.36  (built from source: CMAKE_ARGS="-DGGML_NATIVE=ON",
#                              pip install --no-binary llama-cpp-python)
#   numpy==2.4.6  safetensors==0.6.2  torch==2.9.1  transformers==4.57.1  tokenizers==0.22.2
#   (torch and transformers only for llama.cpp's convert_hf_to_gguf.py)
#
# Steps (each skips what is already there; `all` runs them in order):
#   setup      venv + llama-cpp-python from source + the converter's deps;
#              the package's sdist (for vendor/llama.cpp/convert_hf_to_gguf.py)
#   make-hf    random-weight HF checkpoint: config.json, BF16 safetensors,
#              the bundled model's tokenizer (the converter pads the vocab)
#   convert    GGUF Q8_0 (convert_hf_to_gguf.py --outtype q8_0), Q4_0 from
#              it via llama_model_quantize, and coli containers (int8/int8,
#              int4/int4) from the same checkpoint
#   bench      both engines, 1 and 2 threads, rounds interleaved: a 16-token
#              prompt + 32 greedy tokens, and forced replay of real text
#   gguf-files the three GGUF files of the gguf step (after make-hf)
#   gguf       both engines on the same GGUF files (olmoe-q8_0.gguf from the
#              converter, olmoe-q4_0.gguf and olmoe-q4_k_m.gguf requantized
#              from it), coli straight from the file (`coli bench --model
#              FILE.gguf`), llama.cpp through llama-cpp-python, 1 and 2
#              threads, rounds interleaved: in RAM, or with --cgroup-gb
#              (and --cold) in a memory cgroup on replayed text
#   setup-avx2 a second libllama from the same sdist, built for AVX2 only
#              (-DGGML_NATIVE=OFF, AVX512 and AVX-VNNI off), for `--isa avx2`:
#              both engines then run AVX2 code on an AVX-512 machine (coli
#              through COLI_KERNELS=avx2), standing in for an AVX2-only CPU
#
# `--family qwen35` makes every step use the Qwen3.6-35B-A3B shape
# (qwen3_5_moe_text: Gated DeltaNet + gated attention, 256 experts top-8,
# shared expert) instead of OLMoE-1B-7B, its files under --work/qwen35/
# (the venv and llama.cpp sources stay shared); `--layers 8` keeps it in RAM.
# `--family qwen3moe` does the same with the Qwen3-30B-A3B shape (grouped-
# query attention: 32 query heads over 4 KV heads), under --work/qwen3moe/,
# for the `long` step's figures on a GQA model.
#
# Usage:
#   python3 tools/peers/compare.py all --work /work/bench-data/peers \
#       --coli target/release/coli [--layers 16] [--rounds 3] [--cgroup-gb 4]
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

LLAMA_CPP_PYTHON = "0.3.36"
PIP_PINS = [
    "numpy==2.4.6",
    "safetensors==0.6.2",
    "torch==2.9.1",
    "transformers==4.57.1",
    "tokenizers==0.22.2",
    "sentencepiece",
    "protobuf",
]
REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "models" / "colibri-tiny"

# OLMoE-1B-7B (allenai/OLMoE-1B-7B-0924) shape.
OLMOE = dict(
    vocab_size=50304,
    hidden_size=2048,
    intermediate_size=1024,
    num_hidden_layers=16,
    num_attention_heads=16,
    num_key_value_heads=16,
    num_experts=64,
    num_experts_per_tok=8,
    max_position_embeddings=4096,
)

# Qwen3.6-35B-A3B (Qwen/Qwen3.6-35B-A3B, text model) shape; the release
# has 40 layers, every fourth full attention.
QWEN35 = dict(
    vocab_size=248320,
    hidden_size=2048,
    moe_intermediate_size=512,
    shared_expert_intermediate_size=512,
    num_hidden_layers=40,
    num_attention_heads=16,
    num_key_value_heads=2,
    head_dim=256,
    num_experts=256,
    num_experts_per_tok=8,
    linear_conv_kernel_dim=4,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_num_key_heads=16,
    linear_num_value_heads=32,
    full_attention_interval=4,
    max_position_embeddings=4096,
)

# Qwen3-30B-A3B (Qwen/Qwen3-30B-A3B) shape: grouped-query attention, 32
# query heads sharing 4 KV heads of 128; the release has 48 layers.
QWEN3MOE = dict(
    vocab_size=151936,
    hidden_size=2048,
    intermediate_size=6144,
    moe_intermediate_size=768,
    num_hidden_layers=48,
    num_attention_heads=32,
    num_key_value_heads=4,
    head_dim=128,
    num_experts=128,
    num_experts_per_tok=8,
    max_position_embeddings=40960,
)

# The GGUF architecture name of each family (its metadata keys' prefix).
GGUF_ARCH = {"olmoe": "olmoe", "qwen3moe": "qwen3moe", "qwen35": "qwen35moe"}

# `--isa`: "native" (each engine's best for this CPU) or "avx2".
ISA = "native"

PROMPT_TEXT = "<|user|>\nWhat does river mean in a sentence about the sea?\n<|assistant|>\n"
NEW_TOKENS = 32
PROMPT_LEN = 16


def log(msg):
    print(f"[peers {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(cmd, env=None, **kw):
    log("$ " + " ".join(str(c) for c in cmd))
    return subprocess.run([str(c) for c in cmd], check=True, env=env, **kw)


# ---------------------------------------------------------------- setup

def venv_python(work):
    return work / "venv" / "bin" / "python"


def setup(a):
    work = a.work
    py = venv_python(work)
    if not py.exists():
        run([sys.executable, "-m", "venv", work / "venv"])
    pip = [py, "-m", "pip"]
    have = subprocess.run([py, "-c", "import llama_cpp; print(llama_cpp.__version__)"],
                          capture_output=True, text=True)
    if have.returncode != 0 or have.stdout.strip() != LLAMA_CPP_PYTHON:
        env = dict(os.environ, CMAKE_ARGS="-DGGML_NATIVE=ON")
        env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 1))
        run(pip + ["install", "--no-binary", "llama-cpp-python",
                   f"llama-cpp-python=={LLAMA_CPP_PYTHON}"], env=env)
    run(pip + ["install", "-q"] + PIP_PINS)
    llama_src(work)


AVX2_CMAKE = [
    "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON", "-DGGML_NATIVE=OFF",
    "-DGGML_SSE42=ON", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
    "-DGGML_BMI2=ON", "-DGGML_AVX_VNNI=OFF", "-DGGML_AVX512=OFF", "-DGGML_AVX512_VBMI=OFF",
    "-DGGML_AVX512_VNNI=OFF", "-DGGML_AVX512_BF16=OFF", "-DLLAMA_CURL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_TOOLS=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
]


def avx2_lib_dir(work):
    return work / "llama-avx2" / "bin"


def setup_avx2(a):
    """libllama (and its ggml) for AVX2 only, from the same vendored
    llama.cpp the package was built from; `--isa avx2` loads it through
    llama-cpp-python's LLAMA_CPP_LIB_PATH."""
    py = venv_python(a.work)
    if (avx2_lib_dir(a.work) / "libllama.so").exists():
        return
    run([py, "-m", "pip", "install", "-q", "cmake", "ninja"])
    cmake = a.work / "venv" / "bin" / "cmake"
    build = a.work / "llama-avx2"
    run([cmake, "-S", llama_src(a.work), "-B", build, "-G", "Ninja",
         f"-DCMAKE_MAKE_PROGRAM={a.work / 'venv' / 'bin' / 'ninja'}", *AVX2_CMAKE])
    run([cmake, "--build", build, "--target", "llama", "-j", str(os.cpu_count() or 1)])


def llama_env(a):
    """The environment of a llama.cpp run: the AVX2-only libllama for
    `--isa avx2`, the package's own (native) one otherwise."""
    env = dict(os.environ)
    if a.isa == "avx2":
        lib = avx2_lib_dir(a.work)
        if not (lib / "libllama.so").exists():
            raise SystemExit(f"{lib}/libllama.so is missing: run the setup-avx2 step first")
        env["LLAMA_CPP_LIB_PATH"] = str(lib)
    return env


def llama_system_info(a):
    """llama.cpp's own account of the instruction sets it was built for."""
    code = "import llama_cpp; print(llama_cpp.llama_print_system_info().decode())"
    r = subprocess.run([venv_python(a.work), "-c", code], capture_output=True, text=True, env=llama_env(a))
    return r.stdout.strip() or r.stderr.strip()[-300:]


def coli_kernels(a):
    """The kernel set coli says it runs (`coli doctor`), under the same
    environment as the measured runs."""
    _, env = coli_threads_args(a.coli, 1)
    r = subprocess.run([a.coli, "doctor"], capture_output=True, text=True, env=env)
    for line in (r.stdout + r.stderr).splitlines():
        if "kernel" in line.lower():
            return line.strip()
    return "(coli doctor printed no kernel line)"


def llama_src(work):
    """vendor/llama.cpp of the package's sdist (the converter lives there)."""
    src = work / "sdist" / f"llama_cpp_python-{LLAMA_CPP_PYTHON}" / "vendor" / "llama.cpp"
    if src.exists():
        return src
    sd = work / "sdist"
    sd.mkdir(parents=True, exist_ok=True)
    tgz = sd / f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"
    if not tgz.exists():
        # --no-binary for this package only: `:all:` would also build its
        # build dependencies (cmake) from source to read the metadata.
        run([venv_python(work), "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-python",
             f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", sd])
    with tarfile.open(tgz) as t:
        t.extractall(sd, filter="data")
    return src


SERVER_CMAKE = [
    "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_SERVER=ON",
]


def native_cmake():
    """-DGGML_NATIVE=ON, except on a CPU that lists AMX: a virtual machine
    may list AMX and still refuse its tile instructions (llama-server dies of
    SIGILL in ggml's AMX matmul at its warm-up run), so there the same
    instruction sets are named one by one, AMX left out."""
    flags = set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    if "amx_tile" not in flags:
        return ["-DGGML_NATIVE=ON"]
    named = {"GGML_AVX": "avx", "GGML_AVX2": "avx2", "GGML_FMA": "fma", "GGML_F16C": "f16c",
             "GGML_BMI2": "bmi2", "GGML_AVX_VNNI": "avx_vnni", "GGML_AVX512": "avx512f",
             "GGML_AVX512_VBMI": "avx512vbmi", "GGML_AVX512_VNNI": "avx512_vnni",
             "GGML_AVX512_BF16": "avx512_bf16"}
    return ["-DGGML_NATIVE=OFF", "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"] + [
        f"-D{opt}={'ON' if flag in flags else 'OFF'}" for opt, flag in named.items()]


def server_bin(work):
    return work / "llama-server-build" / "bin" / "llama-server"


def setup_server(a):
    """For the `turns` step: llama.cpp's own `llama-server`, built for this
    CPU from the same vendored llama.cpp as the package, and the converter's
    dependencies (it does not need the llama-cpp-python package itself)."""
    work = a.work
    py = venv_python(work)
    if not py.exists():
        run([sys.executable, "-m", "venv", work / "venv"])
    run([py, "-m", "pip", "install", "-q", "cmake", "ninja"] + PIP_PINS)
    if server_bin(work).exists():
        return
    build = work / "llama-server-build"
    run([work / "venv" / "bin" / "cmake", "-S", llama_src(work), "-B", build, "-G", "Ninja",
         f"-DCMAKE_MAKE_PROGRAM={work / 'venv' / 'bin' / 'ninja'}", *SERVER_CMAKE, *native_cmake()])
    run([work / "venv" / "bin" / "cmake", "--build", build, "--target", "llama-server",
         "-j", str(os.cpu_count() or 1)])


# ---------------------------------------------------------------- make-hf

def bf16_bytes(x):
    """float32 array -> BF16 bytes (round to nearest even)."""
    import numpy as np
    u = x.astype(np.float32).view(np.uint32)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16).tobytes()


def tensor_plan(cfg):
    """(name, shape, kind) in file order; kind picks the distribution."""
    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    plan = [("model.embed_tokens.weight", (v, h), "embed")]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        plan += [
            (p + "input_layernorm.weight", (h,), "norm"),
            (p + "self_attn.q_proj.weight", (h, h), "lin"),
            (p + "self_attn.k_proj.weight", (h, h), "lin"),
            (p + "self_attn.v_proj.weight", (h, h), "lin"),
            (p + "self_attn.o_proj.weight", (h, h), "lin"),
            (p + "self_attn.q_norm.weight", (h,), "norm"),
            (p + "self_attn.k_norm.weight", (h,), "norm"),
            (p + "post_attention_layernorm.weight", (h,), "norm"),
            (p + "mlp.gate.weight", (cfg["num_experts"], h), "router"),
        ]
        plan += experts_plan(p, cfg["num_experts"], i, h)
    plan += [("model.norm.weight", (h,), "norm"), ("lm_head.weight", (v, h), "lin")]
    return plan


def experts_plan(p, ne, i, h):
    """The routed experts of layer prefix `p`: `ne` SwiGLU MLPs of
    intermediate size `i`, named per expert as the published checkpoints."""
    plan = []
    for e in range(ne):
        q = f"{p}mlp.experts.{e}."
        plan += [
            (q + "gate_proj.weight", (i, h), "lin"),
            (q + "up_proj.weight", (i, h), "lin"),
            (q + "down_proj.weight", (h, i), "lin"),
        ]
    return plan


def qwen35_tensor_plan(cfg):
    """(name, shape, kind) of the Qwen3.5-MoE text checkpoint, as `coli
    synth` names and draws it (zero-centred norms "cnorm")."""
    h, v = cfg["hidden_size"], cfg["vocab_size"]
    i, si, ne = cfg["moe_intermediate_size"], cfg["shared_expert_intermediate_size"], cfg["num_experts"]
    nq, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    kh, vh = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    kd, vd, ker = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"], cfg["linear_conv_kernel_dim"]
    conv = 2 * kh * kd + vh * vd
    plan = [("model.embed_tokens.weight", (v, h), "embed")]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        plan += [(p + "input_layernorm.weight", (h,), "cnorm"),
                 (p + "post_attention_layernorm.weight", (h,), "cnorm")]
        if (l + 1) % cfg["full_attention_interval"] == 0:
            plan += [
                (p + "self_attn.q_proj.weight", (2 * nq * hd, h), "lin"),
                (p + "self_attn.k_proj.weight", (nkv * hd, h), "lin"),
                (p + "self_attn.v_proj.weight", (nkv * hd, h), "lin"),
                (p + "self_attn.o_proj.weight", (h, nq * hd), "lin"),
                (p + "self_attn.q_norm.weight", (hd,), "cnorm"),
                (p + "self_attn.k_norm.weight", (hd,), "cnorm"),
            ]
        else:
            q = p + "linear_attn."
            plan += [
                (q + "in_proj_qkv.weight", (conv, h), "lin"),
                (q + "in_proj_z.weight", (vh * vd, h), "lin"),
                (q + "in_proj_b.weight", (vh, h), "lin"),
                (q + "in_proj_a.weight", (vh, h), "lin"),
                (q + "conv1d.weight", (conv, 1, ker), "conv"),
                (q + "A_log", (vh,), "alog"),
                (q + "dt_bias", (vh,), "bias"),
                (q + "norm.weight", (vd,), "norm"),
                (q + "out_proj.weight", (h, vh * vd), "lin"),
            ]
        plan += [(p + "mlp.gate.weight", (ne, h), "router"),
                 (p + "mlp.shared_expert_gate.weight", (1, h), "lin")]
        for pre, n in [("mlp.shared_expert.", si)] + [(f"mlp.experts.{e}.", i) for e in range(ne)]:
            plan += [
                (p + pre + "gate_proj.weight", (n, h), "lin"),
                (p + pre + "up_proj.weight", (n, h), "lin"),
                (p + pre + "down_proj.weight", (h, n), "lin"),
            ]
    plan += [("model.norm.weight", (h,), "cnorm"), ("lm_head.weight", (v, h), "lin")]
    return plan


def qwen3moe_tensor_plan(cfg):
    """(name, shape, kind) of a Qwen3-MoE checkpoint (per-head q/k norms,
    no shared expert)."""
    h, v = cfg["hidden_size"], cfg["vocab_size"]
    i, ne = cfg["moe_intermediate_size"], cfg["num_experts"]
    nq, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    plan = [("model.embed_tokens.weight", (v, h), "embed")]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        plan += [
            (p + "input_layernorm.weight", (h,), "norm"),
            (p + "self_attn.q_proj.weight", (nq * hd, h), "lin"),
            (p + "self_attn.k_proj.weight", (nkv * hd, h), "lin"),
            (p + "self_attn.v_proj.weight", (nkv * hd, h), "lin"),
            (p + "self_attn.o_proj.weight", (h, nq * hd), "lin"),
            (p + "self_attn.q_norm.weight", (hd,), "norm"),
            (p + "self_attn.k_norm.weight", (hd,), "norm"),
            (p + "post_attention_layernorm.weight", (h,), "norm"),
            (p + "mlp.gate.weight", (ne, h), "router"),
        ]
        plan += experts_plan(p, ne, i, h)
    plan += [("model.norm.weight", (h,), "norm"), ("lm_head.weight", (v, h), "lin")]
    return plan


def qwen3moe_config(cfg):
    return {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "sliding_window": None,
        "use_sliding_window": False,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": None,
        "eos_token_id": 5,
        "use_cache": True,
        **cfg,
    }


def draw(rng, shape, kind):
    """Seeded uniform draws: variance 1/fan_in (router 4/fan_in, so routing
    follows the token; embeddings unit variance), norms 1 +- 0.1 -- the
    distributions of `coli synth`, so activations stay finite over 16 layers."""
    import numpy as np
    n = int(np.prod(shape))
    around = {"norm": (1.0, 0.1), "cnorm": (0.0, 0.1), "bias": (0.0, 0.1), "alog": (1.0, 0.5)}
    if kind in around:
        base, amp = around[kind]
        return base + (rng.random(n, dtype=np.float32) * 2 * amp - amp)
    var = {"embed": 1.0, "router": 4.0 / shape[-1], "lin": 1.0 / shape[-1], "conv": 1.0 / shape[-1]}[kind]
    a = np.float32((3.0 * var) ** 0.5)
    x = rng.random(n, dtype=np.float32)
    x *= 2 * a
    x -= a
    return x


def make_hf(a):
    out = a.data / "hf"
    if (out / "model.safetensors").exists():
        log(f"{out} exists")
        return
    import numpy as np
    tmp = a.data / "hf.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if a.family == "qwen35":
        cfg = dict(QWEN35, num_hidden_layers=a.layers)
        config, plan = qwen35_config(cfg), qwen35_tensor_plan(cfg)
    elif a.family == "qwen3moe":
        cfg = dict(QWEN3MOE, num_hidden_layers=a.layers)
        config, plan = qwen3moe_config(cfg), qwen3moe_tensor_plan(cfg)
    else:
        cfg = dict(OLMOE, num_hidden_layers=a.layers)
        config, plan = olmoe_config(cfg), tensor_plan(cfg)
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    for f in ["tokenizer.json", "tokenizer_config.json"]:
        shutil.copy(TINY / f, tmp / f)
    header, off = {}, 0
    for name, shape, _ in plan:
        n = 2
        for d in shape:
            n *= d
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    header["__metadata__"] = {"format": "pt"}
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    rng = np.random.default_rng(a.seed)
    t0 = time.time()
    with open(tmp / "model.safetensors", "wb") as f:
        f.write(len(hb).to_bytes(8, "little"))
        f.write(hb)
        for k, (name, shape, kind) in enumerate(plan):
            f.write(bf16_bytes(draw(rng, shape, kind)))
            if k % 500 == 0:
                log(f"make-hf: {k}/{len(plan)} tensors, {f.tell() / 1e9:.1f} GB")
    tmp.rename(out)
    log(f"make-hf: {off / 1e9:.2f} GB in {time.time() - t0:.0f}s")


def qwen35_config(cfg):
    n = cfg["num_hidden_layers"]
    return {
        "architectures": ["Qwen3_5MoeForCausalLM"],
        "model_type": "qwen3_5_moe_text",
        "layer_types": ["full_attention" if (l + 1) % 4 == 0 else "linear_attention" for l in range(n)],
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                            "mrope_section": [11, 11, 10], "mrope_interleaved": True},
        "rms_norm_eps": 1e-06,
        "hidden_act": "silu",
        "attention_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": None,
        "eos_token_id": 5,
        "mtp_num_hidden_layers": 0,
        **cfg,
    }


def olmoe_config(cfg):
    return {
        "architectures": ["OlmoeForCausalLM"],
        "model_type": "olmoe",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "clip_qkv": None,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "norm_topk_prob": False,
        "output_router_logits": False,
        "rms_norm_eps": 1e-05,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "router_aux_loss_coef": 0.01,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": None,
        "eos_token_id": 5,
        "pad_token_id": 1,
        "use_cache": True,
        **cfg,
    }


# ---------------------------------------------------------------- convert

CONVERT_WRAPPER = r"""
# Runs convert_hf_to_gguf.py with the BPE pre-tokenizer check overridden: the
# bundled tokenizer is a byte-level BPE llama.cpp does not know by hash, and a
# random-weight model's tokenizer only has to be consistent on both sides.
import sys
src = sys.argv.pop(1)
sys.path.insert(0, src + "/gguf-py")
sys.path.insert(0, src)
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
import convert_hf_to_gguf
convert_hf_to_gguf.main()
"""


def quantize(work, src, dst, ftype):
    """`llama_model_quantize` of the package (requantizing: the weights are
    random, only speed is compared, and this skips a 13.8 GB BF16 GGUF)."""
    tmp = Path(str(dst) + ".tmp")
    code = f"""
import llama_cpp, sys
p = llama_cpp.llama_model_quantize_default_params()
p.ftype = llama_cpp.{ftype}
p.nthread = 0
p.allow_requantize = True
sys.exit(llama_cpp.llama_model_quantize(b"{src}", b"{tmp}", p))
"""
    run([venv_python(work), "-c", code])
    tmp.rename(dst)


def q8_gguf(a):
    """The Q8_0 GGUF of the random checkpoint, by llama.cpp's converter."""
    work, src = a.work, llama_src(a.work)
    q8 = a.data / f"{a.family}-q8_0.gguf"
    if not q8.exists():
        wrapper = work / "convert_wrapper.py"
        wrapper.write_text(CONVERT_WRAPPER)
        tmp = Path(str(q8) + ".tmp")
        # The synthetic checkpoint has no MTP layer.
        extra = ["--no-mtp"] if a.family == "qwen35" else []
        run([venv_python(work), wrapper, src, a.data / "hf", "--outtype", "q8_0", "--outfile", tmp, *extra])
        tmp.rename(q8)
    return q8


def convert_q8(a):
    """The Q8_0 GGUF and the int8 coli container, the pair `turns` compares."""
    q8_gguf(a)
    hf = a.data / "hf"
    dst = a.data / "coli-int8"
    if not dst.exists():
        run([a.coli, "convert", "--input", hf, "--output", dst, "--experts", "int8", "--dense", "int8"])


def convert(a):
    convert_q8(a)
    work = a.work
    q8 = a.data / f"{a.family}-q8_0.gguf"
    hf = a.data / "hf"
    q4 = a.data / f"{a.family}-q4_0.gguf"
    if not q4.exists():
        quantize(work, q8, q4, "LLAMA_FTYPE_MOSTLY_Q4_0")
    for bits in ["int4"]:
        dst = a.data / f"coli-{bits}"
        if not dst.exists():
            run([a.coli, "convert", "--input", hf, "--output", dst, "--experts", bits, "--dense", bits])


# ---------------------------------------------------------------- bench

def prompt_and_replay():
    """Token ids of the fixed prompt and of the replay text, through the
    bundled tokenizer (the checkpoint's tokenizer): both engines get ids."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(TINY / "tokenizer.json"))
    prompt = tok.encode(PROMPT_TEXT).ids
    prompt = (prompt * (PROMPT_LEN // max(1, len(prompt)) + 1))[:PROMPT_LEN]
    text = (REPO / "tools" / "peers" / "replay.txt").read_text()
    replay = tok.encode(text).ids
    return prompt, replay


LLAMA_BENCH = r"""
# One llama.cpp measurement: prefill the prompt, then `n` decode steps one
# token at a time, greedy (argmax of the logits) or forced from `forced`.
import json, sys, time
import numpy as np
from llama_cpp import Llama
a = json.loads(sys.argv[1])
llm = Llama(model_path=a["model"], n_ctx=512, n_batch=512, n_threads=a["threads"],
            n_threads_batch=a["threads"], use_mmap=True, verbose=False, seed=0)
n_vocab = llm.n_vocab()
def last_logits():
    # The last token's logits, straight from the context (Llama.scores is
    # only filled with logits_all).
    return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,))
llm.reset()
llm.eval(a["prompt"])
out, forced = [], a.get("forced")
w = a.get("warmup", 0)
for i in range(w + a["n"]):
    if i == w:
        t0 = time.perf_counter()
    tok = int(np.argmax(last_logits()))
    if i >= w:
        out.append(tok)
    llm.eval([forced[i] if forced else tok])
dt = time.perf_counter() - t0
print(json.dumps({"tok_per_s": a["n"] / dt, "tokens": out}))
"""


def coli_threads_args(coli, threads):
    """`--threads N` when coli has it, else RAYON_NUM_THREADS (its compute
    pool is rayon's global pool)."""
    h = subprocess.run([coli, "run", "--help"], capture_output=True, text=True).stdout
    env = dict(os.environ)
    if ISA == "avx2":
        env["COLI_KERNELS"] = "avx2"
    if "--threads" in h:
        return ["--threads", str(threads)], env
    return [], dict(env, RAYON_NUM_THREADS=str(threads))


def in_cgroup(cmd, gb):
    """Wraps `cmd` to run inside a fresh memory cgroup of `gb` GiB (v2
    memory.max or v1 memory.limit_in_bytes; needs root)."""
    if not gb:
        return cmd
    v2 = Path("/sys/fs/cgroup/cgroup.controllers").exists()
    base = Path("/sys/fs/cgroup") if v2 else Path("/sys/fs/cgroup/memory")
    cg = base / f"coli-peers-{os.getpid()}"
    cg.mkdir(exist_ok=True)
    (cg / ("memory.max" if v2 else "memory.limit_in_bytes")).write_text(f"{int(gb * (1 << 30))}\n")
    return ["sh", "-c", f'echo $$ > {cg}/cgroup.procs && exec "$@"', "sh"] + [str(c) for c in cmd]


def drop_caches(a):
    """Empties the page cache before a cold measurement (`--cold`; root):
    pages another cgroup already holds would otherwise be read for free
    inside a memory cgroup."""
    if a.cold:
        subprocess.run(["sync"], check=True)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")


def bench_coli(a, model, threads, prompt, forced):
    drop_caches(a)
    targs, env = coli_threads_args(a.coli, threads)
    ids_file = a.work / "replay-ids.txt"
    if forced is not None:
        ids_file.write_text(" ".join(map(str, prompt + forced)))
        mode = ["--replay", ids_file, "--prompt-len", str(len(prompt))]
    else:
        mode = ["--prompt-ids", ",".join(map(str, prompt))]
    cmd = [a.coli, "bench", "--model", model, *mode, "--warmup", str(a.decode_warmup), "--tokens", str(NEW_TOKENS),
           "--no-compute-bound", "--probe-mb", "16", *targs, *a.coli_args.split()]
    r = subprocess.run(in_cgroup(cmd, a.cgroup_gb), capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"coli bench failed: {r.stderr[-2000:]}")
    m = re.search(r"^measured\s+([0-9.]+)", r.stdout, re.M)
    rec = re.search(r"^pilot\s+recall (\S+) precision ([^\s;]+)", r.stdout, re.M)
    return float(m.group(1)), (rec.groups() if rec else ("n/a", "n/a"))


def bench_llama(a, model, threads, prompt, forced):
    drop_caches(a)
    arg = {"model": str(model), "threads": threads, "prompt": prompt, "n": NEW_TOKENS, "forced": forced,
           "warmup": a.decode_warmup}
    cmd = [venv_python(a.work), "-c", LLAMA_BENCH, json.dumps(arg)]
    r = subprocess.run(in_cgroup(cmd, a.cgroup_gb), capture_output=True, text=True, env=llama_env(a))
    if r.returncode != 0:
        raise RuntimeError(f"llama.cpp failed: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])["tok_per_s"]


def warm_page_cache(*paths):
    """Reads every file of `paths` once, so that the first measured run of
    each engine is not also the one that pulls its weights off the disk."""
    t0 = time.time()
    n = 0
    for root in paths:
        files = [root] if root.is_file() else sorted(q for q in root.rglob("*") if q.is_file())
        for f in files:
            with open(f, "rb") as fh:
                while chunk := fh.read(1 << 24):
                    n += len(chunk)
    log(f"page cache warmed: {n / 1e9:.1f} GB in {time.time() - t0:.0f}s")


def interleaved(a, run_coli, run_llama, label, show=lambda v: f"{v:.2f}"):
    """`a.rounds` rounds of both engines, the order alternating from round
    to round so that drift hits both; `run_*(round)` measures once.
    Returns the coli and the llama.cpp measurements."""
    cs, ls = [], []
    for rnd in range(a.rounds):
        order = ["coli", "llama"] if rnd % 2 == 0 else ["llama", "coli"]
        for who in order:
            if who == "coli":
                cs.append(run_coli(rnd))
            else:
                ls.append(run_llama(rnd))
        log(f"{label} round {rnd}: coli {show(cs[-1])} llama.cpp {show(ls[-1])}")
    return cs, ls


def bench(a):
    prompt, replay = prompt_and_replay()
    w = a.decode_warmup
    if len(replay) < PROMPT_LEN + w + NEW_TOKENS:
        raise SystemExit("tools/peers/replay.txt is too short")
    forced_all = replay[PROMPT_LEN : PROMPT_LEN + w + NEW_TOKENS]
    pairs = [("int8", "coli-int8", f"{a.family}-q8_0.gguf"), ("int4", "coli-int4", f"{a.family}-q4_0.gguf")]
    rows = []
    for bits, cdir, gguf in pairs:
        cm, lm = a.data / cdir, a.data / gguf
        if not (cm.exists() and lm.exists()):
            log(f"skip {bits}: {cm} or {lm} missing")
            continue
        if not a.cold:
            warm_page_cache(cm, lm)
        for mode in ["prompt", "replay"]:
            if a.only and f"{bits}:{mode}" not in a.only.split(","):
                continue
            forced = forced_all if mode == "replay" else None
            p = prompt if mode == "prompt" else replay[:PROMPT_LEN]
            for threads in a.threads:
                runs, ls = interleaved(
                    a,
                    lambda _: bench_coli(a, cm, threads, p, forced),
                    lambda _: bench_llama(a, lm, threads, p, forced),
                    f"{bits} {mode} t={threads}",
                    show=lambda v: f"{v[0] if isinstance(v, tuple) else v:.2f}",
                )
                cs, pilot = [v for v, _ in runs], runs[-1][1]
                rows.append((bits, mode, threads, cs, ls, pilot))
    lines = [
        f"peer comparison {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"{a.family} shape, {a.layers} layers, {a.rounds} rounds, {a.decode_warmup} untimed decode steps first, cgroup {a.cgroup_gb or 'none'} GiB, "
        f"coli flags: {a.coli_args or '(defaults)'}, isa {a.isa}",
        f"llama.cpp: {llama_system_info(a)}",
        f"coli: {coli_kernels(a)}",
        "",
        "| weights | workload | threads | coli tok/s (median, range) | llama.cpp tok/s (median, range) | coli / llama.cpp | pilot recall / precision |",
        "|---|---|---|---|---|---|---|",
    ]
    for bits, mode, threads, cs, ls, pilot in rows:
        cm_, lm_ = statistics.median(cs), statistics.median(ls)
        what = "16-token prompt + 32 greedy" if mode == "prompt" else "32 forced tokens of replay.txt"
        q = "int8 vs Q8_0" if bits == "int8" else "int4 vs Q4_0"
        lines.append(
            f"| {q} | {what} | {threads} | {cm_:.2f} ({min(cs):.2f}-{max(cs):.2f}) | "
            f"{lm_:.2f} ({min(ls):.2f}-{max(ls):.2f}) | {cm_ / lm_:.2f} | {pilot[0]} / {pilot[1]} |"
        )
    print("\n".join(lines))


LLAMA_PREFILL = r"""
# One llama.cpp prefill: the prompt in one batch, timed.
import json, sys, time
from llama_cpp import Llama
a = json.loads(sys.argv[1])
llm = Llama(model_path=a["model"], n_ctx=1024, n_batch=512, n_threads=a["threads"],
            n_threads_batch=a["threads"], use_mmap=True, verbose=False, seed=0)
llm.reset()
t0 = time.perf_counter()
llm.eval(a["prompt"])
print(json.dumps({"secs": time.perf_counter() - t0}))
"""


def prefill_ids(n):
    """`n` token ids spread over the padded vocabulary, the same for both
    engines (prefill speed does not depend on which tokens they are)."""
    return [(i * 7919) % 50000 + 1 for i in range(n)]


def prefill_coli(a, model, threads, prompt):
    targs, env = coli_threads_args(a.coli, threads)
    cmd = [a.coli, "run", "--model", model, "--prompt-ids", ",".join(map(str, prompt)),
           "--max-tokens", "1", "--ids", *targs, *a.coli_args.split()]
    r = subprocess.run(in_cgroup(cmd, a.cgroup_gb), capture_output=True, text=True, env=env)
    m = re.search(r"prefill ([0-9.]+)s", r.stderr)
    if r.returncode != 0 or not m:
        raise RuntimeError(f"coli run failed: {r.stderr[-2000:]}")
    return float(m.group(1))


def prefill_llama(a, model, threads, prompt):
    arg = {"model": str(model), "threads": threads, "prompt": prompt}
    cmd = [venv_python(a.work), "-c", LLAMA_PREFILL, json.dumps(arg)]
    r = subprocess.run(in_cgroup(cmd, a.cgroup_gb), capture_output=True, text=True, env=llama_env(a))
    if r.returncode != 0:
        raise RuntimeError(f"llama.cpp failed: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])["secs"]


def prefill(a):
    """Prompt processing: 16 and 256 tokens in one forward pass, both
    engines from the page cache (a first, discarded run of each warms it)."""
    pairs = [("int8", "coli-int8", f"{a.family}-q8_0.gguf"), ("int4", "coli-int4", f"{a.family}-q4_0.gguf")]
    lines = [
        f"prefill {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {a.rounds} rounds, "
        f"coli flags: {a.coli_args or '(defaults)'}, isa {a.isa}",
        f"llama.cpp: {llama_system_info(a)}",
        f"coli: {coli_kernels(a)}",
        "",
        "| weights | prompt tokens | threads | coli s (best, median) | llama.cpp s (best, median) | llama.cpp / coli (speed ratio) |",
        "|---|---|---|---|---|---|",
    ]
    for bits, cdir, gguf in pairs:
        cm, lm = a.data / cdir, a.data / gguf
        if not (cm.exists() and lm.exists()) or (a.only and bits not in a.only):
            continue
        prefill_coli(a, cm, 2, prefill_ids(16))
        prefill_llama(a, lm, 2, prefill_ids(16))
        for n in (16, 256):
            for threads in a.threads:
                cs, ls = interleaved(
                    a,
                    lambda _: prefill_coli(a, cm, threads, prefill_ids(n)),
                    lambda _: prefill_llama(a, lm, threads, prefill_ids(n)),
                    f"{bits} prefill {n} t={threads}",
                    show=lambda v: f"{v:.2f}s",
                )
                q = "int8 vs Q8_0" if bits == "int8" else "int4 vs Q4_0"
                cmed, lmed = statistics.median(cs), statistics.median(ls)
                lines.append(
                    f"| {q} | {n} | {threads} | {min(cs):.2f}, {cmed:.2f} | {min(ls):.2f}, {lmed:.2f} | {lmed / cmed:.2f} |"
                )
    print("\n".join(lines))


# ---------------------------------------------------------------- long

LONG_DECODE = 16



def long_model(a, src, ctx):
    """`src` (a coli container) with its config's context raised to `ctx`:
    a directory of links to the same files beside a rewritten config.json."""
    dst = src.parent / f"{src.name}-ctx{ctx}"
    dst.mkdir(exist_ok=True)
    for f in src.iterdir():
        t = dst / f.name
        if f.name == "config.json":
            cfg = json.loads(f.read_text())
            cfg["max_position_embeddings"] = ctx
            t.write_text(json.dumps(cfg, indent=2))
        elif not t.exists():
            t.symlink_to(f.resolve())
    return dst


def peak_rss_run(cmd, env):
    """Runs `cmd`, returning (returncode, stderr, its own peak RSS in bytes,
    from wait4's rusage of that one child)."""
    import tempfile
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([str(c) for c in cmd], env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        return proc.returncode, err.read(), usage.ru_maxrss * 1024


def long_coli(a, model, threads, n):
    targs, env = coli_threads_args(a.coli, threads)
    ids = a.work / f"long-{n}.txt"
    ids.write_text(",".join(map(str, prefill_ids(n))))
    # From a file: 32k ids exceed the kernel's 128 KiB cap on one argument.
    cmd = [a.coli, "run", "--model", model, "--prompt-ids-file", ids, "--max-tokens", str(LONG_DECODE),
           "--ids", *targs, *a.coli_args.split()]
    code, stderr, rss = peak_rss_run(in_cgroup(cmd, a.cgroup_gb), env)
    m = re.search(r"prefill ([0-9.]+)s; generated (\d+) tok in ([0-9.]+)s", stderr)
    if code != 0 or not m:
        raise RuntimeError(f"coli run failed: {stderr[-2000:]}")
    gen, secs = int(m.group(2)), float(m.group(3))
    return {"prefill": float(m.group(1)), "decode_tps": gen / secs if secs > 0 else 0.0, "rss": rss}


def long_llama(a, model, threads, n, round_seed):
    """One llama-server run (flash attention on, f16 K and V, one slot of
    n + 32 positions): the prompt, then LONG_DECODE tokens, timed by the
    server's own `timings`; peak RSS from /proc (VmHWM)."""
    port = free_port()
    cmd = [server_bin(a.work), "-m", model, "--host", "127.0.0.1", "--port", str(port), "-np", "1",
           "-c", str(n + LONG_DECODE + 32), "-t", str(threads), "-tb", str(threads), "-fa", "on",
           "-ctk", "f16", "-ctv", "f16", "-b", "512", "-ub", "512",
           # The server caps a slot at the GGUF's training context (4096
           # for the OLMoE shape); raise it as coli's raised config does.
           "--override-kv", f"{GGUF_ARCH[a.family]}.context_length=int:{n + LONG_DECODE + 32}"]
    proc = subprocess.Popen([str(c) for c in cmd], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=open(a.work / "llama-server.log", "w"))
    try:
        wait_ready(f"http://127.0.0.1:{port}/health", proc, "llama-server")
        # A different prompt each round, so nothing is reused.
        ids = [(t + round_seed * 104729) % 50000 + 1 for t in prefill_ids(n)]
        v = post_json(f"http://127.0.0.1:{port}/completion",
                      {"prompt": ids, "n_predict": LONG_DECODE, "temperature": 0, "top_k": 1,
                       "cache_prompt": False, "ignore_eos": True})
        t = v["timings"]
        hwm = 0
        for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) * 1024
        return {"prefill": t["prompt_ms"] / 1e3, "decode_tps": t["predicted_per_second"], "rss": hwm}
    finally:
        proc.terminate()
        proc.wait()


def long(a):
    """Long prompts: prefill of `--long-lens` tokens, then 16 greedy tokens at
    that context, coli (f16 KV by default) against
    llama-server (flash attention, f16 KV), rounds interleaved, both from
    the page cache; peak RSS of each run."""
    src, gguf = a.data / "coli-int8", a.data / f"{a.family}-q8_0.gguf"
    if not (src.exists() and gguf.exists()):
        raise SystemExit(f"the long step needs {src} and {gguf} (run make-hf,convert)")
    top = max(a.long_lens)
    model = long_model(a, src, max(top + LONG_DECODE + 8, 4096))
    lines = [
        f"long {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {a.family} shape, {a.rounds} rounds, "
        f"coli flags: {a.coli_args or '(defaults)'}, isa {a.isa}",
        f"coli: {coli_kernels(a)}",
        "",
        "| prompt tokens | threads | coli prefill tok/s | llama.cpp prefill tok/s | ratio | "
        f"coli decode tok/s at that context | llama.cpp decode tok/s | ratio | coli peak RSS GB | llama.cpp peak RSS GB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    warm_page_cache(src, gguf)
    for n in sorted(a.long_lens):
        for threads in a.threads:
            cs, ls = interleaved(
                a,
                lambda _: long_coli(a, model, threads, n),
                lambda rnd: long_llama(a, gguf, threads, n, rnd),
                f"long {n} t={threads}",
                show=str,
            )
            cp = statistics.median(n / r["prefill"] for r in cs)
            lp = statistics.median(n / r["prefill"] for r in ls)
            cd = statistics.median(r["decode_tps"] for r in cs)
            ld = statistics.median(r["decode_tps"] for r in ls)
            crss = max(r["rss"] for r in cs) / 1e9
            lrss = max(r["rss"] for r in ls) / 1e9
            lines.append(
                f"| {n} | {threads} | {cp:.1f} | {lp:.1f} | {cp / lp:.2f} | {cd:.2f} | {ld:.2f} | {cd / ld:.2f} | "
                f"{crss:.2f} | {lrss:.2f} |"
            )
    print("\n".join(lines))


# ---------------------------------------------------------------- turns

TURNS_CONVERSATIONS = 8
TURNS_SLOTS = 4
TURNS_FIRST = 2000
TURNS_NEW = 16
TURNS_REPLY = 8


def free_port():
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def post_json(url, body, timeout=3600):
    import urllib.request
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def wait_ready(url, proc, what):
    import urllib.error
    import urllib.request
    for _ in range(3000):
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        time.sleep(0.2)
    raise SystemExit(f"{what} was not ready in 10 minutes")


class Coli:
    name = "coli"

    def __init__(self, a, threads, ctx):
        self.port = free_port()
        targs, env = coli_threads_args(a.coli, threads)
        cmd = [a.coli, "serve", "--model", a.work / "coli-int8", "--http", f"127.0.0.1:{self.port}",
               "--kv-slots", str(TURNS_SLOTS), "--ctx", str(ctx), "--no-web", *targs,
               *a.coli_args.split()]
        log("$ " + " ".join(str(c) for c in cmd))
        self.proc = subprocess.Popen([str(c) for c in cmd], env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_ready(f"http://127.0.0.1:{self.port}/health", self.proc, "coli serve")

    def turn(self, ids):
        v = post_json(f"http://127.0.0.1:{self.port}/v1/completions",
                      {"prompt": ids, "max_tokens": TURNS_REPLY, "temperature": 0})
        return v["timings"]["prompt_n"], v["timings"]["cache_n"], v["choices"][0]["text"]

    def close(self):
        self.proc.terminate()
        self.proc.wait()


class LlamaServer:
    name = "llama-server"

    def __init__(self, a, threads, ctx):
        self.port = free_port()
        # -np slots sharing -c; --cache-reuse lets a slot reuse shifted chunks;
        # the host-memory prompt cache (--cache-ram) is on by default where the
        # version has it. cache_prompt is on per request below.
        cmd = [server_bin(a.work), "-m", a.work / "olmoe-q8_0.gguf", "--host", "127.0.0.1",
               "--port", str(self.port), "-np", str(TURNS_SLOTS), "-c", str(ctx * TURNS_SLOTS),
               "-t", str(threads), "-tb", str(threads), "--cache-reuse", "256", "-b", "512", "-ub", "512"]
        log("$ " + " ".join(str(c) for c in cmd))
        self.proc = subprocess.Popen([str(c) for c in cmd], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=open(a.work / "llama-server.log", "w"))
        wait_ready(f"http://127.0.0.1:{self.port}/health", self.proc, "llama-server")

    def turn(self, ids):
        v = post_json(f"http://127.0.0.1:{self.port}/completion",
                      {"prompt": ids, "n_predict": TURNS_REPLY, "temperature": 0, "top_k": 1,
                       "cache_prompt": True, "return_tokens": True})
        t = v["timings"]
        return t["prompt_n"], t.get("cache_n", 0), v.get("tokens") or v["content"]

    def close(self):
        self.proc.terminate()
        self.proc.wait()


def turns_workload(engine, rng_seed, turns):
    """N conversations taking turns round-robin, one request at a time: the
    first turn is TURNS_FIRST token ids, every later one the conversation's
    last prompt plus TURNS_NEW new ids. The reply is not carried into the
    next prompt: an engine's reply comes back as its own tokens (llama-server)
    or as text (coli), and re-tokenizing text would make the two histories
    differ; without it both see exactly the same prompts. Returns per later
    turn (computed tokens, new tokens, seconds)."""
    import random
    rng = random.Random(rng_seed)
    # Ids of ordinary tokens of the bundled vocabulary (6..1023; 0-5 are its specials).
    draw = lambda n: [rng.randrange(6, 1024) for _ in range(n)]
    convs = [draw(TURNS_FIRST) for _ in range(TURNS_CONVERSATIONS)]
    out = []
    for t in range(turns):
        for c in range(TURNS_CONVERSATIONS):
            if t > 0:
                convs[c] = convs[c] + draw(TURNS_NEW)
            t0 = time.perf_counter()
            computed, _cached, _reply = engine.turn(convs[c])
            dt = time.perf_counter() - t0
            if t > 0:
                out.append((computed, TURNS_NEW, dt))
    return out


def turns(a):
    """Prompt reuse across more conversations than slots: coli serve against
    llama-server on the same checkpoint (int8 vs Q8_0), rounds interleaved."""
    convert_q8(a)
    ctx = TURNS_FIRST + a.turns * TURNS_NEW + TURNS_REPLY + 64
    rows = []
    version = subprocess.run([server_bin(a.work), "--version"], capture_output=True, text=True)
    print(f"llama-server: {(version.stdout + version.stderr).strip().splitlines()[0]}")
    print(f"coli: {coli_kernels(a)}")
    for r in range(a.rounds):
        for threads in a.threads:
            for cls, files in [(Coli, a.work / "coli-int8"), (LlamaServer, a.work / "olmoe-q8_0.gguf")]:
                if a.only and a.only != cls.name:
                    continue
                warm_page_cache(files)
                eng = cls(a, threads, ctx)
                try:
                    res = turns_workload(eng, a.seed + r, a.turns)
                finally:
                    eng.close()
                computed = sum(x[0] for x in res)
                new = sum(x[1] for x in res)
                ms = statistics.median(x[2] for x in res) * 1e3
                rows.append((cls.name, threads, r, computed / new, ms))
                log(f"turns: {cls.name} threads {threads} round {r}: computed/new {computed / new:.2f}, "
                    f"median turn {ms:.0f} ms")
    log_path = a.work / "llama-server.log"
    log_text = log_path.read_text(errors="replace") if log_path.exists() else ""
    info = [l for l in log_text.splitlines() if "system_info" in l]
    print(f"llama-server {info[0].strip() if info else '(no system_info line in its log)'}")
    print(f"| engine | threads | computed / new (turns after the first round) | median turn ms (rounds) |")
    print("|---|---|---|---|")
    for name in ["coli", "llama-server"]:
        for threads in a.threads:
            sel = [x for x in rows if x[0] == name and x[1] == threads]
            if not sel:
                continue
            ratio = statistics.median(x[3] for x in sel)
            mss = ", ".join(f"{x[4]:.0f}" for x in sel)
            print(f"| {name} | {threads} | {ratio:.2f} | {mss} |")


def gguf_files(a):
    """The GGUF files the `gguf` step compares on: Q8_0 by llama.cpp's
    converter from the random checkpoint, Q4_0 and Q4_K_M requantized from
    it by `llama_model_quantize` (the weights are random; only speed and
    tokens are compared)."""
    q8 = q8_gguf(a)
    files = [q8]
    for name, ftype in [("q4_0", "LLAMA_FTYPE_MOSTLY_Q4_0"), ("q4_k_m", "LLAMA_FTYPE_MOSTLY_Q4_K_M")]:
        dst = a.data / f"{a.family}-{name}.gguf"
        if not dst.exists():
            quantize(a.work, q8, dst, ftype)
        files.append(dst)
    return files


def gguf(a):
    """Decode on the same GGUF files: coli reading the file as it is
    (`coli bench --model FILE.gguf`) against llama.cpp through
    llama-cpp-python (the `bench` step's harness), rounds interleaved. In
    RAM: the file read into the page cache before each engine's rounds, a
    prompt then greedy tokens. With `--cgroup-gb`: both engines in a memory
    cgroup of that size, cold (`--cold` drops the page cache before every
    run), forced replay of real text so that routing is a real model's."""
    files = [f for f in gguf_files(a) if not a.only or any(o in f.name for o in a.only.split(","))]
    prompt, replay = prompt_and_replay()
    forced = replay if a.cgroup_gb else None
    rows = []
    for path in files:
        for threads in a.threads:
            if not a.cgroup_gb:
                warm_page_cache(path)
            def llama(_):
                # A run the cgroup's OOM killer ends (llama.cpp's anonymous
                # buffers do not fit) is a result, not a crash of the step.
                try:
                    return bench_llama(a, path, threads, prompt, forced)
                except RuntimeError as e:
                    log(f"llama.cpp on {path.name}: {str(e).strip()[:200]}")
                    return float("nan")
            cs, ls = interleaved(
                a,
                lambda _: bench_coli(a, path, threads, prompt, forced)[0],
                llama,
                f"{path.name} t={threads}",
            )
            rows.append((path.name, threads, cs, ls))
    where = f"{a.cgroup_gb} GiB memory cgroup{', cold' if a.cold else ''}, replayed text" if a.cgroup_gb else "in RAM"
    lines = [
        f"gguf comparison {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {where}, {a.rounds} rounds, "
        f"{NEW_TOKENS} tokens, coli flags: {a.coli_args or '(defaults)'}",
        f"llama.cpp: {llama_system_info(a)}",
        f"coli: {coli_kernels(a)}",
        "",
        "| file | threads | coli tok/s (median, range) | llama.cpp tok/s (median, range) | coli / llama.cpp |",
        "|---|---|---|---|---|",
    ]
    for name, threads, cs, ls in rows:
        c = statistics.median(cs)
        ok = [x for x in ls if x == x]
        if not ok:
            lines.append(f"| {name} | {threads} | {c:.2f} ({min(cs):.2f}-{max(cs):.2f}) | failed (every run) | - |")
            continue
        l = statistics.median(ok)
        failed = f", {len(ls) - len(ok)} failed" if len(ok) < len(ls) else ""
        lines.append(f"| {name} | {threads} | {c:.2f} ({min(cs):.2f}-{max(cs):.2f}) | "
                     f"{l:.2f} ({min(ok):.2f}-{max(ok):.2f}{failed}) | {c / l:.2f} |")
    print("\n".join(lines))


def main():
    ap = argparse.ArgumentParser(description="coli vs llama.cpp; see tools/peers/README.md")
    ap.add_argument("steps", help="all, or a comma-separated list of setup,setup-avx2,make-hf,convert,bench,prefill")
    ap.add_argument("--work", type=Path, default=Path("/work/bench-data/peers"))
    ap.add_argument("--coli", type=Path, default=REPO / "target" / "release" / "coli")
    ap.add_argument("--layers", type=int, default=16, help="OLMoE-1B-7B has 16, Qwen3.6-35B-A3B 40")
    ap.add_argument("--family", choices=["olmoe", "qwen3moe", "qwen35"], default="olmoe",
                    help="the checkpoint's shape: OLMoE-1B-7B, Qwen3-30B-A3B (grouped-query attention; "
                         "files under --work/qwen3moe) or Qwen3.6-35B-A3B (files under --work/qwen35)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cgroup-gb", type=float, default=0, help="run each engine in a memory cgroup")
    ap.add_argument("--coli-args", default="", help="extra coli engine flags, e.g. --f32-acts")
    ap.add_argument("--cold", action="store_true", help="drop the page cache before every run (root)")
    ap.add_argument("--only", default="",
                    help="subset, e.g. int8:replay (weights:workload); for gguf, file name parts: q4_0,q4_k_m")
    ap.add_argument("--turns", type=int, default=4, help="turns per conversation (the turns step)")
    ap.add_argument("--long-lens", type=lambda s: [int(x) for x in s.split(",")], default=[2048, 8192, 32768],
                    help="prompt lengths of the long step")
    ap.add_argument("--decode-warmup", type=int, default=0,
                    help="bench: decode steps both engines run untimed before the 32 measured ones")
    ap.add_argument("--isa", choices=["native", "avx2"], default="native",
                    help="avx2: both engines restricted to AVX2 (needs the setup-avx2 step)")
    a = ap.parse_args()
    global ISA
    ISA = a.isa
    a.work = a.work.resolve()
    a.work.mkdir(parents=True, exist_ok=True)
    a.coli = a.coli.resolve()
    a.data = a.work if a.family == "olmoe" else a.work / a.family
    a.data.mkdir(parents=True, exist_ok=True)
    steps = {"setup": setup, "setup-avx2": setup_avx2, "make-hf": make_hf, "convert": convert,
             "bench": bench, "prefill": prefill, "setup-server": setup_server, "turns": turns, "long": long, "gguf": gguf,
             "gguf-files": gguf_files}
    if a.steps == "all":
        todo = [s for s in steps if s not in ("setup-server", "turns", "long", "gguf", "gguf-files") and (s != "setup-avx2" or a.isa == "avx2")]
    else:
        todo = a.steps.split(",")
    for name in todo:
        if name not in steps:
            raise SystemExit(f"unknown step {name!r}")
    while todo and todo[0] in ("setup", "setup-server"):
        # These make the venv the other steps run in.
        steps[todo[0]](a)
        todo = todo[1:]
    if not todo:
        return
    py = venv_python(a.work)
    if Path(sys.prefix).resolve() != (a.work / "venv").resolve():
        # The other steps need numpy and tokenizers: run them in the venv.
        if not py.exists():
            raise SystemExit(f"{py} is missing: run the setup step first")
        rest = [x for x in sys.argv[1:] if x != a.steps]
        os.execv(py, [str(py), __file__, ",".join(todo), *rest])
    for name in todo:
        steps[name](a)


if __name__ == "__main__":
    main()
