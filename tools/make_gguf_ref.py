#!/usr/bin/env python3
# llama.cpp's own outputs on the GGUF fixtures, so that tests can check the
# engine against llama.cpp on the very same file: fixtures/gguf/REF.json,
# plus the quantized fixtures it covers.
#
# Pinned versions (the committed files were produced with exactly these):
#   llama.cpp as vendored by llama-cpp-python 0.3.36 (libllama 0.5.0,
#     ggml 0.25.3, gguf-py 0.19.0), CPU backend built Release with
#     GGML_NATIVE=OFF (AVX2 / AVX-512 variants compiled in), giving
#     llama-quantize and libllama.so;
#   torch==2.9.1  transformers==4.57.1  safetensors==0.6.2  numpy==2.4.6
#     (the peers venv, also used by tools/make_gguf_fixtures.py);
#   gcc 12.2 (any C11 compiler) for tools/gguf_ref.c.
# Usage (CPU only; two runs give byte-identical files):
#   /work/bench-data/peers/venv/bin/python tools/make_gguf_ref.py \
#       LLAMA_CPP_SRC LLAMA_BUILD_BIN [WORK_DIR]
# e.g. LLAMA_CPP_SRC=/work/bench-data/peers/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp
#      LLAMA_BUILD_BIN=/work/bench-data/peers/llama-server-build/bin
# WORK_DIR (default: a temporary directory) receives the harness binary, the
# olmoe-tiny256 HF checkpoint and its F32 GGUF, none of which is committed.
#
# Steps:
#  1. gcc tools/gguf_ref.c against LLAMA_BUILD_BIN/libllama.so (rpath).
#  2. fixtures/gguf/olmoe-tiny-q4_0.gguf: llama-quantize Q4_0 of
#     olmoe-tiny-f32.gguf (olmoe-tiny-f32 / -q8_0 come from
#     tools/make_gguf_fixtures.py and are reused as they are).
#  3. olmoe-tiny256, a second random OLMoE whose every matrix row is 256 long
#     (hidden 256, intermediate 256, 2 layers, 4 heads, 4 experts top-2,
#     vocab 256, fixtures/olmoe-tiny's tokenizer), so that K-quants apply to
#     every tensor: built with transformers under a small seed search (weights
#     drawn as in tools/make_olmoe_fixtures.py), converted to F32 GGUF by
#     llama.cpp's converter (same runner as tools/make_gguf_fixtures.py), then
#     llama-quantize Q2_K, Q3_K_M, Q4_K_M, Q6_K into fixtures/gguf/olmoe-tiny256-*.gguf.
#     The checkpoint itself (~9 MB) is not committed; it is rebuilt here from
#     the seed. It lives outside fixtures/ on purpose: tests treat every
#     fixtures/* directory with a config.json as a loadable checkpoint.
#  4. tools/gguf_ref.c on every GGUF above with prompt = olmoe-tiny REF.json's
#     prompt_ids, teacher-forcing sequence = its full_ids, 24 new tokens;
#     tensor types read back with gguf-py's GGUFReader (llama-quantize picks
#     per-tensor types and falls back where rows do not fit a block).
#  5. Cross-checks: llama.cpp on olmoe-tiny-f32.gguf against
#     fixtures/olmoe-tiny/REF.json (transformers 5.23), and on the
#     olmoe-tiny256 F32 GGUF against transformers on the same checkpoint.
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
GGUF_DIR = os.path.join(REPO, "fixtures", "gguf")
TINY = os.path.join(REPO, "fixtures", "olmoe-tiny")
NEW_TOKENS = 24

# (file, source, llama-quantize type); None = committed by make_gguf_fixtures.py
FILES = [
    ("olmoe-tiny-f32.gguf", None, None),
    ("olmoe-tiny-q8_0.gguf", None, None),
    ("olmoe-tiny-q4_0.gguf", "olmoe-tiny", "Q4_0"),
    ("olmoe-tiny256-q2_k.gguf", "olmoe-tiny256", "Q2_K"),
    ("olmoe-tiny256-q3_k_m.gguf", "olmoe-tiny256", "Q3_K_M"),
    ("olmoe-tiny256-q4_k_m.gguf", "olmoe-tiny256", "Q4_K_M"),
    ("olmoe-tiny256-q6_k.gguf", "olmoe-tiny256", "Q6_K"),
]

TINY256_CONFIG = dict(
    vocab_size=256,
    hidden_size=256,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    num_experts=4,
    num_experts_per_tok=2,
    norm_topk_prob=False,
    tie_word_embeddings=False,
    clip_qkv=None,
    rope_theta=10000.0,
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
    eos_token_id=0,
    pad_token_id=1,
    bos_token_id=None,
)
SEEDS = range(1, 65)
SCALES = [1.0, 1.5]
SHORTLIST = 16

ENV = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")


def build_harness(src, bin_dir, work):
    exe = os.path.join(work, "gguf_ref")
    cmd = ["gcc", "-O2", "-Wall", "-std=c11", "-o", exe, os.path.join(HERE, "gguf_ref.c"),
           "-I", os.path.join(src, "include"), "-I", os.path.join(src, "ggml", "include"),
           "-L", bin_dir, "-lllama", "-lggml", "-lggml-base", "-Wl,-rpath," + bin_dir]
    subprocess.run(cmd, check=True)
    return exe, cmd


def quantize(bin_dir, src_gguf, dst_gguf, qtype):
    cmd = [os.path.join(bin_dir, "llama-quantize"), src_gguf, dst_gguf, qtype, "1"]
    subprocess.run(cmd, check=True, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return cmd


def convert(llama_cpp, hf_dir, outfile):
    sys.path.insert(0, HERE)
    from make_gguf_fixtures import RUNNER

    cmd = [sys.executable, "-c", RUNNER, llama_cpp, hf_dir, "--outfile", outfile, "--outtype", "f32"]
    subprocess.run(cmd, check=True, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


# ---- olmoe-tiny256: transformers checkpoint -------------------------------


def init_weights(model, gen, scale):
    """As tools/make_olmoe_fixtures.py: fan-in scaled matrices, embeddings
    std 1, router and lm_head 6/sqrt(hidden), norms 1 + 0.25 N(0, 1)."""
    import torch

    h = model.config.hidden_size
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.25 * torch.randn(p.shape, generator=gen))
            elif name == "model.embed_tokens.weight":
                p.copy_(torch.randn(p.shape, generator=gen))
            elif name == "lm_head.weight" or name.endswith("mlp.gate.weight"):
                p.copy_(torch.randn(p.shape, generator=gen) * (6.0 / h**0.5))
            elif p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=gen) * (scale / p.shape[1] ** 0.5))
            else:
                raise RuntimeError(f"unexpected parameter {name}")


def hf_evaluate(model, prompt, seq):
    import torch

    def margins(logits):
        t = torch.topk(logits.float(), 2, dim=-1).values
        return (t[..., 0] - t[..., 1])

    # plain greedy loop (full recompute each step, no eos stop): pure argmax
    ids, gen_margins = list(prompt), []
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            last = model(torch.tensor([ids]), use_cache=False).logits[0, -1]
            gen_margins.append(margins(last).item())
            ids.append(int(last.argmax()))
        fw = model(torch.tensor([seq]), output_router_logits=True, use_cache=False)
    logits = fw.logits[0]
    k = model.config.num_experts_per_tok
    gap, usage = float("inf"), []
    for rl in fw.router_logits:
        top = torch.topk(rl.float(), k + 1, dim=-1)
        gap = min(gap, (top.values[:, k - 1] - top.values[:, k]).min().item())
        usage.append(len(set(top.indices[:, :k].flatten().tolist())))
    greedy = ids[len(prompt):]
    return dict(
        greedy=greedy,
        gen_min_margin=min(gen_margins),
        tf_pred=logits.argmax(-1).tolist(),
        tf_min_margin=margins(logits).min().item(),
        logit_std=logits.std().item(),
        min_router_gap=gap,
        expert_usage=usage,
        distinct_new=len(set(greedy)),
        logits_last=logits[-1].tolist(),
    )


def build_tiny256(seed, scale):
    import torch
    from transformers import OlmoeConfig, OlmoeForCausalLM

    cfg = OlmoeConfig(**TINY256_CONFIG)
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = OlmoeForCausalLM(cfg).eval()
    init_weights(model, torch.Generator().manual_seed(seed), scale)
    return model


def save_tiny256(model, hf_dir):
    shutil.rmtree(hf_dir, ignore_errors=True)
    model.config.architectures = ["OlmoeForCausalLM"]
    model.save_pretrained(hf_dir, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(TINY, f), os.path.join(hf_dir, f))


def hf_search(prompt, seq):
    """Candidates meeting the transformers criteria, best HF score first."""
    import torch

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    found = []
    for scale in SCALES:
        for seed in SEEDS:
            model = build_tiny256(seed, scale)
            r = hf_evaluate(model, prompt, seq)
            mm = min(r["gen_min_margin"], r["tf_min_margin"])
            ok = (mm > 0.05 and mm > 0.01 * r["logit_std"] and r["min_router_gap"] > 2e-3
                  and r["distinct_new"] >= NEW_TOKENS // 2
                  and min(r["expert_usage"]) >= model.config.num_experts - 1)
            score = min(mm, 5 * r["min_router_gap"])
            print(f"  olmoe-tiny256 seed={seed} scale={scale}: margin {mm:.4f} (logit std "
                  f"{r['logit_std']:.2f}) router gap {r['min_router_gap']:.4f} usage "
                  f"{r['expert_usage']} distinct {r['distinct_new']} -> {'ok' if ok else 'no'}",
                  flush=True)
            if ok:
                r.update(seed=seed, scale=scale, hf_score=score)
                found.append(r)
    found.sort(key=lambda r: (-r["hf_score"], r["seed"], r["scale"]))
    if not found:
        sys.exit("olmoe-tiny256: no candidate met the margin criteria")
    return found


def llama_score(out):
    """The smallest decision margin llama.cpp itself has on one file: top-2
    logit gap (greedy and teacher-forced) and 5x the router gap."""
    return min(min(out["greedy_margin"]), min(out["tf_margin"]),
               5 * min(out["tf_router_gap"]), 5 * out["min_router_gap_greedy"])


def make_tiny256(llama_cpp, bin_dir, exe, work, prompt, seq):
    """Seed search: the transformers criteria first, then, for the best
    SHORTLIST candidates, the margins llama.cpp has on each quantized file
    (the references are llama.cpp's outputs on those files, so they must not
    hinge on near-ties either). Leaves the chosen checkpoint in
    WORK/olmoe-tiny256 and its F32 GGUF in WORK/olmoe-tiny256-f32.gguf."""
    hf_dir = os.path.join(work, "olmoe-tiny256")
    f32 = os.path.join(work, "olmoe-tiny256-f32.gguf")
    qtypes = [q for _, src, q in FILES if src == "olmoe-tiny256"]
    best = None
    for r in hf_search(prompt, seq)[:SHORTLIST]:
        save_tiny256(build_tiny256(r["seed"], r["scale"]), hf_dir)
        convert(llama_cpp, hf_dir, f32)
        scores = {}
        for q in qtypes:
            qpath = os.path.join(work, f"cand-{q}.gguf")
            quantize(bin_dir, f32, qpath, q)
            scores[q] = llama_score(run_harness(exe, qpath, prompt, seq))
        score = min([r["hf_score"]] + list(scores.values()))
        print(f"  olmoe-tiny256 seed={r['seed']} scale={r['scale']}: hf {r['hf_score']:.4f}, "
              + ", ".join(f"{q} {v:.4f}" for q, v in scores.items()), flush=True)
        if best is None or score > best[0]:
            best = (score, r, scores)
    score, r, scores = best
    r.update(llama_scores=scores, score=score)
    save_tiny256(build_tiny256(r["seed"], r["scale"]), hf_dir)
    convert(llama_cpp, hf_dir, f32)
    return r, hf_dir, f32


# ---- reading the files back ------------------------------------------------


def tensor_types(llama_cpp, path):
    sys.path.insert(0, os.path.join(llama_cpp, "gguf-py"))
    from gguf import GGUFReader

    return {t.name: t.tensor_type.name for t in GGUFReader(path).tensors}


def run_harness(exe, path, prompt, seq):
    cmd = [exe, path, ",".join(map(str, prompt)), ",".join(map(str, seq)), str(NEW_TOKENS)]
    out = subprocess.run(cmd, check=True, env=ENV, capture_output=True, text=True).stdout
    return json.loads(out)


def summary_types(types):
    """{ggml type: tensor count} for the log."""
    out = {}
    for t in types.values():
        out[t] = out.get(t, 0) + 1
    return dict(sorted(out.items()))


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit("usage: make_gguf_ref.py LLAMA_CPP_SRC LLAMA_BUILD_BIN [WORK_DIR]")
    llama_cpp, bin_dir = (os.path.abspath(a) for a in sys.argv[1:3])
    tmp = None
    if len(sys.argv) == 4:
        work = os.path.abspath(sys.argv[3])
        os.makedirs(work, exist_ok=True)
    else:
        tmp = tempfile.TemporaryDirectory()
        work = tmp.name

    ref_tiny = json.load(open(os.path.join(TINY, "REF.json")))
    prompt, seq = ref_tiny["prompt_ids"], ref_tiny["full_ids"]

    exe, gcc_cmd = build_harness(llama_cpp, bin_dir, work)

    print("olmoe-tiny256: searching", flush=True)
    hf, hf256, f32_256 = make_tiny256(llama_cpp, bin_dir, exe, work, prompt, seq)

    sources = {"olmoe-tiny": os.path.join(GGUF_DIR, "olmoe-tiny-f32.gguf"), "olmoe-tiny256": f32_256}
    commands = {}
    for name, src, qtype in FILES:
        if src is not None:
            cmd = quantize(bin_dir, sources[src], os.path.join(GGUF_DIR, name), qtype)
            commands[name] = "llama-quantize " + " ".join(
                [f"{src}-f32.gguf", name, qtype, cmd[-1]])

    files = {}
    for name, _, _ in FILES:
        path = os.path.join(GGUF_DIR, name)
        out = run_harness(exe, path, prompt, seq)
        types = tensor_types(llama_cpp, path)
        files[name] = dict(
            size=os.path.getsize(path),
            model_desc=out["model_desc"],
            type_counts=summary_types(types),
            tensor_types=types,
            greedy=out["greedy"],
            greedy_margin=out["greedy_margin"],
            tf_argmax=out["tf_argmax"],
            tf_margin=out["tf_margin"],
            min_greedy_margin=min(out["greedy_margin"]),
            min_tf_margin=min(out["tf_margin"]),
            n_expert_used=out["n_expert_used"],
            tf_router_gap=out["tf_router_gap"],
            min_router_gap_tf=min(out["tf_router_gap"]),
            min_router_gap_greedy=out["min_router_gap_greedy"],
            logits_first=out["logits_first"],
            logits_last=out["logits_last"],
            tf_seq_argmax=out["tf_seq_argmax"],
            tf_seq_margin=out["tf_seq_margin"],
            min_tf_seq_margin=min(out["tf_seq_margin"]),
            logits_last_seq=out["logits_last_seq"],
        )
        if name in commands:
            files[name]["made_by"] = commands[name]
        settings = out["settings"]
        print(f"{name}: {files[name]['size']} bytes, {files[name]['type_counts']}, "
              f"min margin greedy {files[name]['min_greedy_margin']:.4f} "
              f"tf {files[name]['min_tf_margin']:.4f}, router gap tf "
              f"{files[name]['min_router_gap_tf']:.4f} greedy {files[name]['min_router_gap_greedy']:.4f}",
              flush=True)

    # cross-checks against transformers
    f32 = files["olmoe-tiny-f32.gguf"]
    n = len(prompt)
    check_tiny = dict(
        oracle="fixtures/olmoe-tiny/REF.json (transformers 5.23.0, f32, eager)",
        tf_argmax_mismatches=sum(a != b for a, b in zip(f32["tf_argmax"], ref_tiny["tf_pred"])),
        greedy_mismatches=sum(a != b for a, b in zip(f32["greedy"], ref_tiny["full_ids"][n:])),
        logits_last_max_abs_diff=max(abs(a - b) for a, b in zip(f32["logits_last"], ref_tiny["logits_last"])),
    )
    out256 = run_harness(exe, f32_256, prompt, seq)
    check_256 = dict(
        oracle="transformers 4.57.1 OlmoeForCausalLM on the olmoe-tiny256 checkpoint (f32, eager)",
        tf_argmax_mismatches=sum(a != b for a, b in zip(out256["tf_argmax"], hf["tf_pred"])),
        greedy_mismatches=sum(a != b for a, b in zip(out256["greedy"], hf["greedy"])),
        logits_last_max_abs_diff=max(abs(a - b) for a, b in zip(out256["logits_last"], hf["logits_last"])),
    )
    print("cross-check olmoe-tiny f32:", check_tiny, flush=True)
    print("cross-check olmoe-tiny256 f32:", check_256, flush=True)

    import numpy
    import safetensors
    import torch
    import transformers

    tiny256 = dict(
        config={k: v for k, v in TINY256_CONFIG.items()},
        seed=hf["seed"],
        scale=hf["scale"],
        weights="as tools/make_olmoe_fixtures.py init_weights: matrices N(0,1)*scale/sqrt(fan_in), "
                "embeddings N(0,1), router and lm_head N(0,1)*6/sqrt(hidden), norms 1+0.25*N(0,1); "
                "torch.manual_seed(seed) then a torch.Generator seeded with seed, in named_parameters order",
        tokenizer="copied from fixtures/olmoe-tiny",
        hf_greedy=hf["greedy"],
        hf_tf_pred=hf["tf_pred"],
        hf_gen_min_margin=hf["gen_min_margin"],
        hf_tf_min_margin=hf["tf_min_margin"],
        hf_min_router_gap=hf["min_router_gap"],
        hf_expert_usage=hf["expert_usage"],
        selection=f"seeds {SEEDS.start}..{SEEDS.stop - 1} x scales {SCALES}: transformers criteria "
                  "(min top-2 margin > 0.05 and > 1% of the logit std, router gap > 2e-3, >= E-1 experts "
                  "used per layer, >= 12 distinct greedy tokens), score min(margin, 5 x router gap); the "
                  f"best {SHORTLIST} are converted and quantized and the one with the largest min(hf score, "
                  "llama.cpp's min(top-2 margin, 5 x router gap) on each quantized file) is kept",
        llama_scores=hf["llama_scores"],
        score=hf["score"],
        f32_gguf_tensor_types=summary_types(tensor_types(llama_cpp, f32_256)),
        f32_gguf_size=os.path.getsize(f32_256),
    )
    ref = dict(
        generator=dict(
            script="tools/make_gguf_ref.py",
            harness="tools/gguf_ref.c",
            llama_cpp="vendored by llama-cpp-python 0.3.36",
            libllama=os.path.basename(os.path.realpath(os.path.join(bin_dir, "libllama.so"))),
            libggml_base=os.path.basename(os.path.realpath(os.path.join(bin_dir, "libggml-base.so"))),
            gguf_py="0.19.0",
            torch=torch.__version__,
            transformers=transformers.__version__,
            safetensors=safetensors.__version__,
            numpy=numpy.__version__,
            compile=" ".join(a.replace(llama_cpp, "$LLAMA_CPP_SRC").replace(bin_dir, "$LLAMA_BUILD_BIN")
                             .replace(work, "$WORK").replace(REPO + "/", "") for a in gcc_cmd),
            run="gguf_ref FILE PROMPT_IDS FULL_IDS 24",
            settings=settings,
            backend="CPU only, n_gpu_layers 0, no weight repacking (use_extra_bufts false)",
        ),
        prompt_ids=prompt,
        full_ids=seq,
        new_tokens=NEW_TOKENS,
        files=files,
        olmoe_tiny256=tiny256,
        cross_checks={"olmoe-tiny-f32.gguf": check_tiny, "olmoe-tiny256-f32.gguf (not committed)": check_256},
    )
    with open(os.path.join(GGUF_DIR, "REF.json"), "w") as f:
        json.dump(ref, f)
        f.write("\n")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
