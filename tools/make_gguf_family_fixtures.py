#!/usr/bin/env python3
# GGUF fixtures of the MoE decoder families other than OLMoE, written by
# llama.cpp's own converter and quantizer, and llama.cpp's outputs on them:
# fixtures/gguf/families/{*.gguf, REF.json}, read by tests/gguf_llama_cpp.rs.
#
# Pinned versions (the committed files were produced with exactly these):
#   llama.cpp as vendored by llama-cpp-python 0.3.36 (libllama 0.5.0,
#     ggml 0.25.3, gguf-py 0.19.0): its converter, and the venv's own
#     libllama (llama_model_quantize through the Python bindings; the
#     tools/gguf_ref.c harness linked against the same library);
#   torch==2.9.1  transformers==4.57.1  safetensors==0.6.2  numpy==2.4.6;
#   gcc 12.2 (any C11 compiler) for tools/gguf_ref.c.
# Usage (CPU only):
#   /work/bench-data/peers/venv/bin/python tools/make_gguf_family_fixtures.py \
#       LLAMA_CPP_SRC [WORK_DIR]
# e.g. LLAMA_CPP_SRC=/work/bench-data/peers/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp
#
# For each family below: a random transformers checkpoint whose every
# matrix row is a multiple of 32 long (so Q8_0 and Q4_0 apply to every
# tensor), chosen by a small seed search so that neither transformers nor
# llama.cpp decides a token or an expert by a near-tie; converted to F32
# GGUF by llama.cpp's converter, quantized to Q8_0 and Q4_0 by llama.cpp;
# then tools/gguf_ref.c on each file (prompt and teacher-forcing sequence of
# fixtures/olmoe-tiny/REF.json, 24 new tokens). The F32 file is checked
# against transformers on the same checkpoint (cross_checks in REF.json).
#
#   qwen3moe  Qwen3MoeForCausalLM: GQA, per-head q/k norm, softmax router
#             renormalised (llama.cpp always renormalises Qwen3-MoE's).
#   glm4moe   Glm4MoeForCausalLM: q/k/v biases, partial rotary, q/k norm,
#             a dense first layer, sigmoid router with a correction bias,
#             a shared expert, routed scaling, and one next-token (MTP)
#             layer appended to the checkpoint as GLM-4.5 ships it (the
#             converter keeps it; llama.cpp's main graph does not run it).
#
# The checkpoints use fixtures/olmoe-tiny's tokenizer (256 tokens), whose
# pre-tokenizer llama.cpp does not know by hash: the converter is told
# "gpt-2", and GLM's converter, which looks for GLM's own special tokens,
# writes the plain GPT-2 vocabulary instead. Only token ids matter here.
import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
OUT = os.path.join(REPO, "fixtures", "gguf", "families")
TINY = os.path.join(REPO, "fixtures", "olmoe-tiny")
NEW_TOKENS = 24
QTYPES = ["Q8_0", "Q4_0"]
# Seeds tried per family, and the smallest top-k gap of the selection
# scores transformers must show: sigmoid scores (GLM) have gaps an order
# below softmax logits', so GLM draws from more seeds and is held to a
# smaller gap, and then the llama.cpp margins decide among a longer list.
SEEDS = {"qwen3moe": range(1, 65), "glm4moe": range(1, 201)}
MIN_ROUTER_GAP = {"qwen3moe": 2e-3, "glm4moe": 1e-3}
SHORTLIST = 8
ENV = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")

QWEN3 = dict(
    vocab_size=256, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
    mlp_only_layers=[], rope_theta=1e6, max_position_embeddings=512, rms_norm_eps=1e-6,
    tie_word_embeddings=False, eos_token_id=0, pad_token_id=1, bos_token_id=None,
)
GLM4 = dict(
    vocab_size=256, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
    num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    partial_rotary_factor=0.5, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2,
    first_k_dense_replace=1, n_group=1, topk_group=1, norm_topk_prob=True,
    routed_scaling_factor=2.5, use_qk_norm=True, attention_bias=True, rope_theta=10000.0,
    max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=False,
    num_nextn_predict_layers=1, eos_token_id=0, pad_token_id=1, bos_token_id=None,
)
FAMILIES = {"qwen3moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", QWEN3),
            "glm4moe": ("Glm4MoeConfig", "Glm4MoeForCausalLM", GLM4)}

RUNNER = """
import sys
src = sys.argv.pop(1)
sys.path.insert(0, src + "/gguf-py")
sys.path.insert(0, src)
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
import conversion.glm as glm
glm.Glm4MoeModel.set_vocab = lambda self: self._set_vocab_gpt2()
import convert_hf_to_gguf
convert_hf_to_gguf.main()
"""


# The router's scale: sigmoid scores (GLM) saturate, and their top-k gaps
# vanish, at the softmax routers' scale.
ROUTER_SCALE = {"qwen3moe": 6.0, "glm4moe": 1.5}


def init_weights(model, gen, router_scale):
    """Fan-in scaled matrices, embeddings N(0,1), lm_head 6/sqrt(hidden),
    router router_scale/sqrt(hidden), norms 1 + 0.25 N(0,1), biases 0.1 N(0,1) (the router's
    correction bias 0.05 N(0,1)), in named_parameters order."""
    import torch

    h = model.config.hidden_size
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.25 * torch.randn(p.shape, generator=gen))
            elif name == "model.embed_tokens.weight":
                p.copy_(torch.randn(p.shape, generator=gen))
            elif name == "lm_head.weight":
                p.copy_(torch.randn(p.shape, generator=gen) * (6.0 / h**0.5))
            elif name.endswith("mlp.gate.weight"):
                p.copy_(torch.randn(p.shape, generator=gen) * (router_scale / h**0.5))
            elif name.endswith("e_score_correction_bias"):
                p.copy_(0.05 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            elif p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[1] ** 0.5)
            elif p.dim() == 3:
                # transformers 5 stacks experts [E, out, in]
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[2] ** 0.5)
            else:
                raise RuntimeError(f"unexpected parameter {name}")
        # transformers keeps the correction bias as a buffer in some versions
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.05 * torch.randn(b.shape, generator=gen))


def build(family, seed):
    import torch
    import transformers

    cfg_name, model_name, cfg = FAMILIES[family]
    config = getattr(transformers, cfg_name)(**cfg)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(config).eval()
    init_weights(model, torch.Generator().manual_seed(seed), ROUTER_SCALE[family])
    return model


def router_scores(model):
    """Forward hooks collecting each sparse layer's selection scores (the
    values top-k is taken over)."""
    import torch

    found = []

    def hook(mod, args, out):
        bias = getattr(mod, "e_score_correction_bias", None)
        if bias is None:
            found.append(out.float())
            return
        # GLM's router returns its choice; its scores are recomputed
        x = args[0].reshape(-1, mod.weight.shape[1]).float()
        logits = torch.nn.functional.linear(x, mod.weight.float())
        found.append(torch.sigmoid(logits) + bias.float())

    handles = [m.register_forward_hook(hook) for n, m in model.named_modules()
               if n.endswith("mlp.gate") and not n.startswith("model.layers.mtp")]
    return found, handles


def hf_evaluate(model, prompt, seq):
    import torch

    def margins(logits):
        t = torch.topk(logits.float(), 2, dim=-1).values
        return t[..., 0] - t[..., 1]

    ids, gen_margins = list(prompt), []
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            last = model(torch.tensor([ids]), use_cache=False).logits[0, -1]
            gen_margins.append(margins(last).item())
            ids.append(int(last.argmax()))
        scores, handles = router_scores(model)
        logits = model(torch.tensor([seq]), use_cache=False).logits[0]
        for h in handles:
            h.remove()
    k = model.config.num_experts_per_tok
    gap, usage = float("inf"), []
    for s in scores:
        s = s.reshape(-1, s.shape[-1])
        top = torch.topk(s, k + 1, dim=-1)
        gap = min(gap, (top.values[:, k - 1] - top.values[:, k]).min().item())
        usage.append(len(set(top.indices[:, :k].flatten().tolist())))
    greedy = ids[len(prompt):]
    return dict(
        greedy=greedy, gen_min_margin=min(gen_margins), tf_pred=logits.argmax(-1).tolist(),
        tf_min_margin=margins(logits).min().item(), logit_std=logits.std().item(),
        min_router_gap=gap, expert_usage=usage, distinct_new=len(set(greedy)),
        logits_last=logits[-1].tolist(),
    )


def add_mtp_layer(model, hf_dir, seed):
    """GLM-4.5 ships its next-token layer as model.layers.N (N =
    num_hidden_layers) beside eh_proj / enorm / hnorm / shared_head.norm;
    transformers does not build it, so its tensors are drawn here (the
    same shapes as a sparse layer's) and added to the safetensors file."""
    import torch
    from safetensors.torch import load_file, save_file

    path = os.path.join(hf_dir, "model.safetensors")
    tensors = load_file(path)
    n = model.config.num_hidden_layers
    gen = torch.Generator().manual_seed(1000 + seed)
    src = f"model.layers.{n - 1}."
    for name, t in list(tensors.items()):
        if name.startswith(src):
            new = f"model.layers.{n}." + name[len(src):]
            tensors[new] = (t.float() + 0.01 * torch.randn(t.shape, generator=gen)).contiguous()
    h = model.config.hidden_size
    tensors[f"model.layers.{n}.eh_proj.weight"] = torch.randn(h, 2 * h, generator=gen) / (2 * h) ** 0.5
    for norm in ("enorm", "hnorm", "shared_head.norm"):
        tensors[f"model.layers.{n}.{norm}.weight"] = 1.0 + 0.25 * torch.randn(h, generator=gen)
    save_file(tensors, path, metadata={"format": "pt"})


def save(family, model, hf_dir, seed):
    shutil.rmtree(hf_dir, ignore_errors=True)
    model.config.architectures = [FAMILIES[family][1]]
    model.save_pretrained(hf_dir, safe_serialization=True)
    if family == "glm4moe":
        add_mtp_layer(model, hf_dir, seed)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(TINY, f), os.path.join(hf_dir, f))


def convert(llama_cpp, hf_dir, outfile):
    cmd = [sys.executable, "-c", RUNNER, llama_cpp, hf_dir, "--outfile", outfile, "--outtype", "f32"]
    subprocess.run(cmd, check=True, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def quantize(src, dst, qtype):
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{qtype}")
    params.nthread = 1
    rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params))
    if rc != 0:
        sys.exit(f"llama_model_quantize {qtype} of {src} failed: {rc}")


def build_harness(src, lib_dir, work):
    exe = os.path.join(work, "gguf_ref")
    cmd = ["gcc", "-O2", "-Wall", "-std=c11", "-o", exe, os.path.join(HERE, "gguf_ref.c"),
           "-I", os.path.join(src, "include"), "-I", os.path.join(src, "ggml", "include"),
           "-L", lib_dir, "-lllama", "-lggml", "-lggml-base", "-Wl,-rpath," + lib_dir]
    subprocess.run(cmd, check=True)
    return exe, cmd


def run_harness(exe, path, prompt, seq):
    cmd = [exe, path, ",".join(map(str, prompt)), ",".join(map(str, seq)), str(NEW_TOKENS)]
    out = subprocess.run(cmd, check=True, env=ENV, capture_output=True, text=True).stdout
    return json.loads(out)


def llama_score(out):
    return min(min(out["greedy_margin"]), min(out["tf_margin"]), min(out["tf_seq_margin"]),
               5 * min(out["tf_router_gap"]), 5 * out["min_router_gap_greedy"])


def tensor_types(llama_cpp, path):
    sys.path.insert(0, os.path.join(llama_cpp, "gguf-py"))
    from gguf import GGUFReader

    return {t.name: t.tensor_type.name for t in GGUFReader(path).tensors}


def search(family, llama_cpp, exe, work, prompt, seq):
    import torch

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    found = []
    for seed in SEEDS[family]:
        model = build(family, seed)
        r = hf_evaluate(model, prompt, seq)
        mm = min(r["gen_min_margin"], r["tf_min_margin"])
        n_exp = FAMILIES[family][2].get("num_experts", FAMILIES[family][2].get("n_routed_experts"))
        ok = (mm > 0.05 and mm > 0.01 * r["logit_std"] and r["min_router_gap"] > MIN_ROUTER_GAP[family]
              and r["distinct_new"] >= NEW_TOKENS // 2 and min(r["expert_usage"]) >= n_exp - 2)
        print(f"  {family} seed={seed}: margin {mm:.4f} router gap {r['min_router_gap']:.4f} "
              f"usage {r['expert_usage']} distinct {r['distinct_new']} -> {'ok' if ok else 'no'}",
              flush=True)
        if ok:
            r.update(seed=seed, hf_score=min(mm, 5 * r["min_router_gap"]))
            found.append(r)
    if not found:
        sys.exit(f"{family}: no candidate met the margin criteria")
    found.sort(key=lambda r: (-r["hf_score"], r["seed"]))
    hf_dir, f32 = os.path.join(work, family), os.path.join(work, f"{family}-f32.gguf")
    best = None
    for r in found[:SHORTLIST]:
        save(family, build(family, r["seed"]), hf_dir, r["seed"])
        convert(llama_cpp, hf_dir, f32)
        scores = {"F32": llama_score(run_harness(exe, f32, prompt, seq))}
        for q in QTYPES:
            qpath = os.path.join(work, f"cand-{q}.gguf")
            quantize(f32, qpath, q)
            scores[q] = llama_score(run_harness(exe, qpath, prompt, seq))
        score = min([r["hf_score"]] + list(scores.values()))
        print(f"  {family} seed={r['seed']}: hf {r['hf_score']:.4f}, "
              + ", ".join(f"{q} {v:.4f}" for q, v in scores.items()), flush=True)
        if best is None or score > best[0]:
            best = (score, r, scores)
    score, r, scores = best
    r.update(llama_scores=scores, score=score)
    save(family, build(family, r["seed"]), hf_dir, r["seed"])
    convert(llama_cpp, hf_dir, f32)
    return r, f32


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: make_gguf_family_fixtures.py LLAMA_CPP_SRC [WORK_DIR]")
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
    ref_tiny = json.load(open(os.path.join(TINY, "REF.json")))
    prompt, seq = ref_tiny["prompt_ids"], ref_tiny["full_ids"]
    exe, gcc_cmd = build_harness(llama_cpp, lib_dir, work)
    os.makedirs(OUT, exist_ok=True)

    files, families, checks = {}, {}, {}
    for family in FAMILIES:
        print(f"{family}: searching", flush=True)
        hf, f32 = search(family, llama_cpp, exe, work, prompt, seq)
        paths = {"F32": f32}
        for q in QTYPES:
            paths[q] = os.path.join(OUT, f"{family}-tiny-{q.lower()}.gguf")
            quantize(f32, paths[q], q)
        shutil.copy(f32, os.path.join(OUT, f"{family}-tiny-f32.gguf"))
        paths["F32"] = os.path.join(OUT, f"{family}-tiny-f32.gguf")
        for qtype, path in paths.items():
            out = run_harness(exe, path, prompt, seq)
            name = os.path.basename(path)
            types = tensor_types(llama_cpp, path)
            files[name] = dict(
                family=family, size=os.path.getsize(path), model_desc=out["model_desc"],
                tensor_types=types, greedy=out["greedy"], greedy_margin=out["greedy_margin"],
                tf_argmax=out["tf_argmax"], tf_margin=out["tf_margin"],
                tf_router_gap=out["tf_router_gap"], min_router_gap_greedy=out["min_router_gap_greedy"],
                logits_first=out["logits_first"], logits_last=out["logits_last"],
                tf_seq_argmax=out["tf_seq_argmax"], tf_seq_margin=out["tf_seq_margin"],
                logits_last_seq=out["logits_last_seq"],
                made_by="converter --outtype f32" if qtype == "F32" else f"llama_model_quantize {qtype} of the F32 file",
            )
            settings = out["settings"]
            print(f"{name}: {files[name]['size']} bytes, min margin greedy "
                  f"{min(out['greedy_margin']):.4f} tf_seq {min(out['tf_seq_margin']):.4f}", flush=True)
        f32_out = files[f"{family}-tiny-f32.gguf"]
        checks[f"{family}-tiny-f32.gguf"] = dict(
            oracle=f"transformers 4.57.1 {FAMILIES[family][1]} on the same checkpoint (f32, eager)",
            tf_argmax_mismatches=sum(a != b for a, b in zip(f32_out["tf_seq_argmax"], hf["tf_pred"])),
            greedy_mismatches=sum(a != b for a, b in zip(f32_out["greedy"], hf["greedy"])),
            logits_last_max_abs_diff=max(abs(a - b) for a, b in zip(f32_out["logits_last_seq"], hf["logits_last"])),
        )
        print("cross-check", family, checks[f"{family}-tiny-f32.gguf"], flush=True)
        families[family] = dict(
            config=FAMILIES[family][2], seed=hf["seed"], hf_greedy=hf["greedy"],
            hf_tf_pred=hf["tf_pred"], hf_min_router_gap=hf["min_router_gap"],
            llama_scores=hf["llama_scores"], score=hf["score"],
        )

    import numpy
    import safetensors
    import torch
    import transformers

    ref = dict(
        generator=dict(
            script="tools/make_gguf_family_fixtures.py", harness="tools/gguf_ref.c",
            llama_cpp="vendored by llama-cpp-python 0.3.36",
            libllama=os.path.basename(os.path.realpath(os.path.join(lib_dir, "libllama.so"))),
            torch=torch.__version__, transformers=transformers.__version__,
            safetensors=safetensors.__version__, numpy=numpy.__version__,
            compile=" ".join(a.replace(llama_cpp, "$LLAMA_CPP_SRC").replace(lib_dir, "$LLAMA_LIB")
                             .replace(work, "$WORK").replace(REPO + "/", "") for a in gcc_cmd),
            settings=settings,
        ),
        prompt_ids=prompt, full_ids=seq, new_tokens=NEW_TOKENS,
        files=files, families=families, cross_checks=checks,
    )
    with open(os.path.join(OUT, "REF.json"), "w") as f:
        json.dump(ref, f)
        f.write("\n")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
