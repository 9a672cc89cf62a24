#!/usr/bin/env python3
# GGUF fixtures of llama.cpp's `qwen3next` (Qwen3-Next) and `qwen35moe`
# (Qwen3.5 / 3.6 MoE) architectures (Gated DeltaNet linear attention
# beside gated full attention, a softmax router and a sigmoid-gated shared
# expert), written by llama.cpp's own converter and quantizer, and
# llama.cpp's outputs on them: fixtures/gguf/families/{qwen3next,
# qwen35moe}/{*.gguf, REF.json}, read by tests/gguf_qwen35.rs.
#
# Pinned versions (the committed files were produced with exactly these):
#   llama.cpp as vendored by llama-cpp-python 0.3.36 (libllama 0.5.0,
#     ggml 0.25.3, gguf-py 0.19.0): its converter, and the venv's own
#     libllama (llama_model_quantize through the Python bindings; the
#     tools/gguf_ref.c harness linked against the same library);
#   torch==2.9.1  safetensors==0.6.2  numpy==2.4.6;
#   qwen3next: transformers==4.57.1 (the peers venv);
#   qwen35moe: transformers==5.23.0  tokenizers==0.23.3  safetensors==0.8.0
#     (a venv of its own whose .pth reaches the peers venv's torch and
#     llama-cpp-python);
#   gcc 12.2 (any C11 compiler) for tools/gguf_ref.c.
# Usage (CPU only):
#   /work/bench-data/peers/venv/bin/python tools/make_gguf_qwen35_fixtures.py \
#       LLAMA_CPP_SRC [WORK_DIR]
#   TF5_VENV/bin/python tools/make_gguf_qwen35_fixtures.py LLAMA_CPP_SRC [WORK_DIR] --arch qwen35moe
# e.g. LLAMA_CPP_SRC=/work/bench-data/peers/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp
#
# The checkpoint: a random Qwen3NextForCausalLM (transformers' own class)
# with hidden 64 and 4 layers, linear and full attention alternating
# (full_attention_interval 2, so both layer kinds appear twice), 4 value
# heads over 2 key heads (the grouped repeat of q/k), 8 experts of which 2
# are used, every matrix row a multiple of 32 long (so Q8_0 and Q4_0 apply
# to every matrix). Its zero-centred norms are drawn around 0 (the
# converter stores them as 1 + w), the gated norm around 1. A small seed
# search keeps a checkpoint on which neither transformers nor llama.cpp
# decides a token or an expert by a near-tie. It is converted to F32 GGUF
# by llama.cpp's converter (--no-mtp: transformers builds no next-token
# layer), quantized to Q8_0 and Q4_0 by llama.cpp, and tools/gguf_ref.c
# runs on each file (prompt and teacher-forcing sequence of
# fixtures/olmoe-tiny/REF.json, 24 new tokens). The F32 file is checked
# against transformers on the same checkpoint (cross_checks in REF.json).
#
# qwen35moe: the same shapes as a Qwen3_5MoeForCausalLM (transformers 5:
# separate in_proj_qkv / in_proj_z / in_proj_b / in_proj_a, fused expert
# tensors, no dense layers), rope_parameters with mrope_section [1, 1, 0]
# (text positions make interleaved M-RoPE plain RoPE). Its converter also
# reorders the linear layers' value heads from grouped to tiled order,
# which the 4-over-2 heads exercise.
#
# The helpers (conversion runner, quantizer, harness, scoring) are those of
# tools/make_gguf_family_fixtures.py, imported from beside this file.
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_gguf_family_fixtures as fam  # noqa: E402

REPO = fam.REPO
# Seeds screened per architecture (transformers 5's fallbacks are slower).
SEEDS = {"qwen3next": range(1, 49), "qwen35moe": range(1, 25)}
MIN_ROUTER_GAP = 2e-3
SHORTLIST = 6

CONFIG = dict(
    vocab_size=256, hidden_size=64, intermediate_size=64, moe_intermediate_size=32,
    shared_expert_intermediate_size=32, num_hidden_layers=4, full_attention_interval=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, partial_rotary_factor=0.25,
    linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
    linear_num_key_heads=2, linear_num_value_heads=4,
    num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
    mlp_only_layers=[], rope_theta=1e6, max_position_embeddings=512, rms_norm_eps=1e-6,
    tie_word_embeddings=False, eos_token_id=0, pad_token_id=1, bos_token_id=None,
)
CONFIG35 = dict(
    vocab_size=256, hidden_size=64, moe_intermediate_size=32,
    shared_expert_intermediate_size=32, num_hidden_layers=4,
    layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
    num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    rope_parameters=dict(rope_type="default", rope_theta=1e6, partial_rotary_factor=0.25,
                         mrope_section=[1, 1, 0], mrope_interleaved=True),
    linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
    linear_num_key_heads=2, linear_num_value_heads=4,
    num_experts=8, num_experts_per_tok=2, max_position_embeddings=512, rms_norm_eps=1e-6,
    tie_word_embeddings=False, eos_token_id=0, pad_token_id=1, bos_token_id=None,
)
# arch -> (config class, model class, config, transformers it was made with)
ARCHS = {
    "qwen3next": ("Qwen3NextConfig", "Qwen3NextForCausalLM", CONFIG, "4.57.1"),
    "qwen35moe": ("Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM", CONFIG35, "5.23.0"),
}
FAMILY = "qwen3next"


def out_dir():
    return os.path.join(REPO, "fixtures", "gguf", "families", FAMILY)


def router_scores(model):
    """Forward hooks collecting each sparse layer's router logits: the
    output of a Linear router (transformers 4) or the first of the
    (logits, weights, indices) a transformers 5 router returns."""
    found = []

    def hook(mod, args, out):
        found.append((out[0] if isinstance(out, tuple) else out).float())

    handles = [m.register_forward_hook(hook) for n, m in model.named_modules()
               if n.endswith("mlp.gate")]
    return found, handles


fam.router_scores = router_scores


def init_weights(model, gen):
    """Every parameter drawn, in named_parameters order: zero-centred norms
    0.25 N(0,1), the gated norm 1 + 0.25 N(0,1), embeddings N(0,1), lm_head
    and router 6/sqrt(hidden) N(0,1), A_log U(-1, 1.5), dt_bias 0.5 N(0,1),
    the convolution N(0,1)/sqrt(kernel), other matrices fan-in scaled."""
    import torch

    h = model.config.hidden_size
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=gen)
            if name.endswith("linear_attn.norm.weight"):
                p.copy_(1.0 + 0.25 * r)
            elif name.endswith("norm.weight"):
                p.copy_(0.25 * r)
            elif name == "model.embed_tokens.weight":
                p.copy_(r)
            elif name == "lm_head.weight" or name.endswith("mlp.gate.weight"):
                p.copy_(r * (6.0 / h**0.5))
            elif name.endswith("A_log"):
                p.copy_(-1.0 + 2.5 * torch.rand(p.shape, generator=gen))
            elif name.endswith("dt_bias"):
                p.copy_(0.5 * r)
            elif name.endswith("conv1d.weight"):
                p.copy_(r / p.shape[-1] ** 0.5)
            elif p.dim() == 2:
                p.copy_(r / p.shape[1] ** 0.5)
            elif p.dim() == 3:
                # transformers 5 stacks the experts [E, out, in]
                p.copy_(r / p.shape[2] ** 0.5)
            else:
                raise RuntimeError(f"unexpected parameter {name}")


def build(seed):
    import torch
    import transformers

    cfg_name, model_name, cfg, _ = ARCHS[FAMILY]
    config = getattr(transformers, cfg_name)(**cfg)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(config).eval()
    init_weights(model, torch.Generator().manual_seed(seed))
    return model


def save(model, hf_dir):
    shutil.rmtree(hf_dir, ignore_errors=True)
    model.config.architectures = [ARCHS[FAMILY][1]]
    model.save_pretrained(hf_dir, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(fam.TINY, f), os.path.join(hf_dir, f))


def convert(llama_cpp, hf_dir, outfile):
    cmd = [sys.executable, "-c", fam.RUNNER, llama_cpp, hf_dir, "--outfile", outfile,
           "--outtype", "f32", "--no-mtp"]
    subprocess.run(cmd, check=True, env=fam.ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def search(llama_cpp, exe, work, prompt, seq):
    import torch

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    found = []
    for seed in SEEDS[FAMILY]:
        r = fam.hf_evaluate(build(seed), prompt, seq)
        mm = min(r["gen_min_margin"], r["tf_min_margin"])
        ok = (mm > 0.05 and mm > 0.01 * r["logit_std"] and r["min_router_gap"] > MIN_ROUTER_GAP
              and r["distinct_new"] >= fam.NEW_TOKENS // 2
              and min(r["expert_usage"]) >= ARCHS[FAMILY][2]["num_experts"] - 2)
        print(f"  seed={seed}: margin {mm:.4f} router gap {r['min_router_gap']:.4f} "
              f"usage {r['expert_usage']} distinct {r['distinct_new']} -> {'ok' if ok else 'no'}",
              flush=True)
        if ok:
            r.update(seed=seed, hf_score=min(mm, 5 * r["min_router_gap"]))
            found.append(r)
    if not found:
        sys.exit("no candidate met the margin criteria")
    found.sort(key=lambda r: (-r["hf_score"], r["seed"]))
    hf_dir, f32 = os.path.join(work, FAMILY), os.path.join(work, f"{FAMILY}-f32.gguf")
    assert ARCHS[FAMILY][3] == __import__("transformers").__version__, "wrong transformers for " + FAMILY
    best = None
    for r in found[:SHORTLIST]:
        save(build(r["seed"]), hf_dir)
        convert(llama_cpp, hf_dir, f32)
        scores = {"F32": fam.llama_score(fam.run_harness(exe, f32, prompt, seq))}
        for q in fam.QTYPES:
            qpath = os.path.join(work, f"cand-{q}.gguf")
            fam.quantize(f32, qpath, q)
            scores[q] = fam.llama_score(fam.run_harness(exe, qpath, prompt, seq))
        score = min([r["hf_score"]] + list(scores.values()))
        print(f"  seed={r['seed']}: hf {r['hf_score']:.4f}, "
              + ", ".join(f"{q} {v:.4f}" for q, v in scores.items()), flush=True)
        if best is None or score > best[0]:
            best = (score, r, scores)
    score, r, scores = best
    r.update(llama_scores=scores, score=score)
    save(build(r["seed"]), hf_dir)
    convert(llama_cpp, hf_dir, f32)
    return r, f32


def main():
    global FAMILY
    if len(sys.argv) >= 3 and sys.argv[-2] == "--arch":
        FAMILY = sys.argv[-1]
        del sys.argv[-2:]
    if FAMILY not in ARCHS or len(sys.argv) not in (2, 3):
        sys.exit("usage: make_gguf_qwen35_fixtures.py LLAMA_CPP_SRC [WORK_DIR] [--arch qwen35moe]")
    OUT = out_dir()
    llama_cpp = os.path.abspath(sys.argv[1])
    import llama_cpp as bindings

    lib_dir = os.path.join(os.path.dirname(bindings.__file__), "lib")
    tmp = None
    if len(sys.argv) == 3:
        work = os.path.abspath(sys.argv[2])
        os.makedirs(work, exist_ok=True)
    else:
        tmp = tempfile.TemporaryDirectory()
        work = tmp.name
    ref_tiny = json.load(open(os.path.join(fam.TINY, "REF.json")))
    prompt, seq = ref_tiny["prompt_ids"], ref_tiny["full_ids"]
    exe, gcc_cmd = fam.build_harness(llama_cpp, lib_dir, work)
    os.makedirs(OUT, exist_ok=True)

    print(f"{FAMILY}: searching", flush=True)
    hf, f32 = search(llama_cpp, exe, work, prompt, seq)
    paths = {"F32": os.path.join(OUT, f"{FAMILY}-tiny-f32.gguf")}
    shutil.copy(f32, paths["F32"])
    for q in fam.QTYPES:
        paths[q] = os.path.join(OUT, f"{FAMILY}-tiny-{q.lower()}.gguf")
        fam.quantize(f32, paths[q], q)
    files = {}
    for qtype, path in paths.items():
        out = fam.run_harness(exe, path, prompt, seq)
        name = os.path.basename(path)
        files[name] = dict(
            family=FAMILY, size=os.path.getsize(path), model_desc=out["model_desc"],
            tensor_types=fam.tensor_types(llama_cpp, path), greedy=out["greedy"],
            greedy_margin=out["greedy_margin"], tf_argmax=out["tf_argmax"],
            tf_margin=out["tf_margin"], tf_router_gap=out["tf_router_gap"],
            min_router_gap_greedy=out["min_router_gap_greedy"],
            logits_first=out["logits_first"], logits_last=out["logits_last"],
            tf_seq_argmax=out["tf_seq_argmax"], tf_seq_margin=out["tf_seq_margin"],
            logits_last_seq=out["logits_last_seq"],
            made_by="converter --outtype f32 --no-mtp" if qtype == "F32"
            else f"llama_model_quantize {qtype} of the F32 file",
        )
        settings = out["settings"]
        print(f"{name}: {files[name]['size']} bytes, min margin greedy "
              f"{min(out['greedy_margin']):.4f} tf_seq {min(out['tf_seq_margin']):.4f}", flush=True)
    f32_out = files[f"{FAMILY}-tiny-f32.gguf"]
    checks = {f"{FAMILY}-tiny-f32.gguf": dict(
        oracle=f"transformers {ARCHS[FAMILY][3]} {ARCHS[FAMILY][1]} on the same checkpoint (f32, eager, "
               "torch fallbacks of the convolution and the chunked delta rule)",
        tf_argmax_mismatches=sum(a != b for a, b in zip(f32_out["tf_seq_argmax"], hf["tf_pred"])),
        greedy_mismatches=sum(a != b for a, b in zip(f32_out["greedy"], hf["greedy"])),
        logits_last_max_abs_diff=max(abs(a - b) for a, b in zip(f32_out["logits_last_seq"], hf["logits_last"])),
    )}
    print("cross-check", checks, flush=True)

    import numpy
    import safetensors
    import torch
    import transformers

    ref = dict(
        generator=dict(
            script="tools/make_gguf_qwen35_fixtures.py", harness="tools/gguf_ref.c",
            llama_cpp="vendored by llama-cpp-python 0.3.36",
            libllama=os.path.basename(os.path.realpath(os.path.join(lib_dir, "libllama.so"))),
            torch=torch.__version__, transformers=transformers.__version__,
            safetensors=safetensors.__version__, numpy=numpy.__version__,
            compile=" ".join(a.replace(llama_cpp, "$LLAMA_CPP_SRC").replace(lib_dir, "$LLAMA_LIB")
                             .replace(work, "$WORK").replace(REPO + "/", "") for a in gcc_cmd),
            settings=settings,
        ),
        prompt_ids=prompt, full_ids=seq, new_tokens=fam.NEW_TOKENS, files=files,
        families={FAMILY: dict(
            config=ARCHS[FAMILY][2], seed=hf["seed"], hf_greedy=hf["greedy"], hf_tf_pred=hf["tf_pred"],
            hf_min_router_gap=hf["min_router_gap"], llama_scores=hf["llama_scores"],
            score=hf["score"],
        )},
        cross_checks=checks,
    )
    with open(os.path.join(OUT, "REF.json"), "w") as f:
        json.dump(ref, f)
        f.write("\n")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
