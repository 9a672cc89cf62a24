#!/usr/bin/env python3
# GGUF fixtures of llama.cpp's `gpt-oss` and `minimax-m2` architectures,
# written by llama.cpp's own converter and quantizer, and llama.cpp's
# outputs on them: fixtures/gguf/families/{gpt-oss,minimax-m2}/{*.gguf,
# REF.json}, read by tests/gguf_gptoss_minimax.rs.
#
# Pinned versions (the committed files were produced with exactly these):
#   llama.cpp as vendored by llama-cpp-python 0.3.36 (libllama 0.5.0,
#     ggml 0.25.3, gguf-py 0.19.0): its converter, and the venv's own
#     libllama (llama_model_quantize through the Python bindings; the
#     tools/gguf_ref.c harness linked against the same library);
#   torch==2.9.1  transformers==4.57.1  safetensors==0.6.2  numpy==2.4.6;
#   gcc 12.2 (any C11 compiler) for tools/gguf_ref.c.
# Usage (CPU only):
#   [TF5_PATH=DIR] /work/bench-data/peers/venv/bin/python \
#       tools/make_gguf_gptoss_minimax_fixtures.py [--only gpt-oss|minimax-m2] LLAMA_CPP_SRC [WORK_DIR]
# e.g. LLAMA_CPP_SRC=/work/bench-data/peers/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp
#
# A random GptOssForCausalLM whose every matrix row is a multiple of 32 long
# (so Q8_0, Q4_0 and MXFP4 apply to every tensor): GQA, q/k/v/o biases, one
# attention sink per head, a sliding window of 4 on the even layer (shorter
# than the prompt) and full attention on the odd one, YaRN (factor 4 over
# an original context of 16, so the ramp is active; `truncate: true`, the
# rounding ggml always applies, so that transformers and llama.cpp compute
# the same frequencies), a biased router, experts with biases whose gate
# values reach the SwiGLU clamp (7.0). The checkpoint stores the experts in
# the BF16 release's fused layout (gate and up interleaved) as F32; the
# converter splits them. Converted to F32 GGUF, then quantized by
# llama.cpp to Q8_0, Q4_0 and MXFP4_MOE (MXFP4 experts, Q8_0 elsewhere).
# A small seed search keeps a model on which neither transformers nor
# llama.cpp decides a token or an expert by a near-tie. Each file then goes
# through tools/gguf_ref.c (prompt and teacher-forcing sequence of
# fixtures/olmoe-tiny/REF.json, 24 new tokens), and the F32 file is checked
# against transformers on the same checkpoint (cross_checks in REF.json).
#
# MiniMax-M2 (MiniMaxM2ForCausalLM) has no class in transformers 4.57.1, and
# llama.cpp's converter only reads config.json and the safetensors, so its
# checkpoint is written directly in the release's layout (per-expert
# `block_sparse_moe.experts.E.{w1,w2,w3}`, the router's
# `e_score_correction_bias`, q/k norms over all heads, `rotary_dim`,
# `scoring_func: sigmoid`): hidden 64, 2 layers, 4 heads of 32 (so heads
# are wider than hidden / heads), 2 KV heads, rotary_dim 16 (half the
# head), 8 experts of 32 rows, top-2; converted to F32, quantized to Q8_0
# and Q4_0, the seed chosen on llama.cpp's margins alone (1..MINIMAX_SEEDS).
# With TF5_PATH set to a directory holding transformers 5.23.0 (pip
# install --target), transformers' MiniMaxM2ForCausalLM is run on the
# checkpoint in a subprocess for the F32 cross-check.
#
# The checkpoints use fixtures/olmoe-tiny's tokenizer (256 tokens); the
# converter is told its pre-tokenizer is "gpt-2". Only token ids matter.
import json
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_gguf_family_fixtures as fam  # noqa: E402  (shared converter, quantizer, harness)

REPO = os.path.dirname(HERE)
FAMILIES_DIR = os.path.join(REPO, "fixtures", "gguf", "families")
OUT = os.path.join(FAMILIES_DIR, "gpt-oss")
QTYPES = ["Q8_0", "Q4_0", "MXFP4_MOE"]
SEEDS = range(1, 41)
SHORTLIST = 4
MIN_ROUTER_GAP = 2e-3
NEW_TOKENS = fam.NEW_TOKENS

GPTOSS = dict(
    vocab_size=256, hidden_size=64, intermediate_size=32, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
    num_experts_per_tok=2, sliding_window=4, layer_types=["sliding_attention", "full_attention"],
    rope_theta=150000.0,
    rope_scaling=dict(rope_type="yarn", factor=4.0, beta_fast=32.0, beta_slow=1.0, truncate=True,
                      original_max_position_embeddings=16),
    swiglu_limit=7.0, max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=False,
    eos_token_id=0, pad_token_id=1, bos_token_id=None,
)


def init_weights(model, gen):
    """Fan-in scaled matrices, embeddings N(0,1), lm_head 6/sqrt(hidden),
    router 6/sqrt(hidden), norms 1 + 0.25 N(0,1), biases 0.1 N(0,1), sinks
    N(0,1), fused experts [E, in, out] at 3/sqrt(in) so that gate values
    pass the clamp; in named_parameters order."""
    import torch

    h = model.config.hidden_size
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=gen)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.25 * r)
            elif name == "model.embed_tokens.weight":
                p.copy_(r)
            elif name == "lm_head.weight":
                p.copy_(r * (6.0 / h**0.5))
            elif name.endswith("mlp.router.weight"):
                p.copy_(r * (6.0 / h**0.5))
            elif name.endswith("sinks"):
                p.copy_(r)
            elif name.endswith("bias"):
                p.copy_(0.1 * r)
            elif name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
                p.copy_(r * (3.0 / p.shape[1] ** 0.5))
            elif p.dim() == 2:
                p.copy_(r / p.shape[1] ** 0.5)
            else:
                raise RuntimeError(f"unexpected parameter {name}")


def build(seed):
    import torch
    import transformers

    config = transformers.GptOssConfig(**GPTOSS)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.GptOssForCausalLM(config).eval()
    init_weights(model, torch.Generator().manual_seed(seed))
    return model


def router_scores(model):
    """Forward hooks collecting each layer's biased router logits (what
    top-k is taken over)."""
    import torch

    found = []

    def hook(mod, args, out):
        x = args[0].reshape(-1, mod.weight.shape[1]).float()
        found.append(torch.nn.functional.linear(x, mod.weight.float(), mod.bias.float()))

    handles = [m.register_forward_hook(hook) for n, m in model.named_modules() if n.endswith("mlp.router")]
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
        top = torch.topk(s, k + 1, dim=-1)
        gap = min(gap, (top.values[:, k - 1] - top.values[:, k]).min().item())
        usage.append(len(set(top.indices[:, :k].flatten().tolist())))
    greedy = ids[len(prompt):]
    return dict(
        greedy=greedy, gen_min_margin=min(gen_margins), tf_pred=logits.argmax(-1).tolist(),
        tf_min_margin=margins(logits).min().item(), logit_std=logits.std().item(),
        min_router_gap=gap, expert_usage=usage, distinct_new=len(set(greedy)),
        logits_last=logits[-1].tolist(), logits_first=logits[0].tolist(),
    )


def save(model, hf_dir):
    shutil.rmtree(hf_dir, ignore_errors=True)
    model.config.architectures = ["GptOssForCausalLM"]
    model.save_pretrained(hf_dir, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(fam.TINY, f), os.path.join(hf_dir, f))


def search(llama_cpp, exe, work, prompt, seq):
    import torch

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    found = []
    n_exp = GPTOSS["num_local_experts"]
    for seed in SEEDS:
        r = hf_evaluate(build(seed), prompt, seq)
        mm = min(r["gen_min_margin"], r["tf_min_margin"])
        ok = (mm > 0.05 and mm > 0.01 * r["logit_std"] and r["min_router_gap"] > MIN_ROUTER_GAP
              and r["distinct_new"] >= NEW_TOKENS // 2 and min(r["expert_usage"]) >= n_exp - 1)
        print(f"  gpt-oss seed={seed}: margin {mm:.4f} router gap {r['min_router_gap']:.4f} "
              f"usage {r['expert_usage']} distinct {r['distinct_new']} -> {'ok' if ok else 'no'}",
              flush=True)
        if ok:
            r.update(seed=seed, hf_score=min(mm, 5 * r["min_router_gap"]))
            found.append(r)
    if not found:
        sys.exit("gpt-oss: no candidate met the margin criteria")
    found.sort(key=lambda r: (-r["hf_score"], r["seed"]))
    hf_dir, f32 = os.path.join(work, "gpt-oss"), os.path.join(work, "gpt-oss-f32.gguf")
    best = None
    for r in found[:SHORTLIST]:
        save(build(r["seed"]), hf_dir)
        fam.convert(llama_cpp, hf_dir, f32)
        scores = {"F32": fam.llama_score(fam.run_harness(exe, f32, prompt, seq))}
        for q in QTYPES:
            qpath = os.path.join(work, f"cand-{q}.gguf")
            fam.quantize(f32, qpath, q)
            scores[q] = fam.llama_score(fam.run_harness(exe, qpath, prompt, seq))
        score = min([r["hf_score"]] + list(scores.values()))
        print(f"  gpt-oss seed={r['seed']}: hf {r['hf_score']:.4f}, "
              + ", ".join(f"{q} {v:.4f}" for q, v in scores.items()), flush=True)
        if best is None or score > best[0]:
            best = (score, r, scores)
    score, r, scores = best
    r.update(llama_scores=scores, score=score)
    save(build(r["seed"]), hf_dir)
    fam.convert(llama_cpp, hf_dir, f32)
    return r, f32


MINIMAX = dict(
    architectures=["MiniMaxM2ForCausalLM"], model_type="minimax_m2", vocab_size=256, hidden_size=64,
    intermediate_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    head_dim=32, rotary_dim=16, num_local_experts=8, num_experts_per_tok=2, rope_theta=5e6,
    rms_norm_eps=1e-6, max_position_embeddings=512, scoring_func="sigmoid", use_qk_norm=True,
    qk_norm_type="per_layer", hidden_act="silu", tie_word_embeddings=False, eos_token_id=0,
    pad_token_id=1, bos_token_id=None, torch_dtype="float32",
)
MINIMAX_SEEDS = range(1, 25)
MINIMAX_QTYPES = ["Q8_0", "Q4_0"]

TF5_RUNNER = """
import json, sys, torch, transformers
hf_dir, prompt, seq, n_new = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), int(sys.argv[4])
torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)
m = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager").eval()
ids = list(prompt)
with torch.no_grad():
    for _ in range(n_new):
        ids.append(int(m(torch.tensor([ids]), use_cache=False).logits[0, -1].argmax()))
    logits = m(torch.tensor([seq]), use_cache=False).logits[0]
print(json.dumps(dict(version=transformers.__version__, greedy=ids[len(prompt):],
                      tf_pred=logits.argmax(-1).tolist(), logits_first=logits[0].tolist(),
                      logits_last=logits[-1].tolist())))
"""


def minimax_checkpoint(seed, hf_dir):
    """The release's layout, drawn as the other fixtures draw theirs:
    fan-in scaled matrices, embeddings N(0,1), lm_head 6/sqrt(hidden), router
    1.5/sqrt(hidden) (sigmoid scores saturate at the softmax routers'
    scale), norms 1 + 0.25 N(0,1), correction bias 0.05 N(0,1)."""
    import torch
    from safetensors.torch import save_file

    c = MINIMAX
    h, hd, nh, nkv = c["hidden_size"], c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
    inter, ne = c["intermediate_size"], c["num_local_experts"]
    gen = torch.Generator().manual_seed(seed)
    t = {}

    def mat(name, rows, cols, scale=None):
        t[name] = torch.randn(rows, cols, generator=gen) * (scale if scale is not None else 1.0 / cols**0.5)

    def norm(name, n):
        t[name] = 1.0 + 0.25 * torch.randn(n, generator=gen)

    mat("model.embed_tokens.weight", c["vocab_size"], h, 1.0)
    for layer in range(c["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        norm(p + "input_layernorm.weight", h)
        mat(p + "self_attn.q_proj.weight", nh * hd, h)
        mat(p + "self_attn.k_proj.weight", nkv * hd, h)
        mat(p + "self_attn.v_proj.weight", nkv * hd, h)
        mat(p + "self_attn.o_proj.weight", h, nh * hd)
        norm(p + "self_attn.q_norm.weight", nh * hd)
        norm(p + "self_attn.k_norm.weight", nkv * hd)
        norm(p + "post_attention_layernorm.weight", h)
        mat(p + "block_sparse_moe.gate.weight", ne, h, 1.5 / h**0.5)
        t[p + "block_sparse_moe.e_score_correction_bias"] = 0.05 * torch.randn(ne, generator=gen)
        for e in range(ne):
            q = p + f"block_sparse_moe.experts.{e}."
            mat(q + "w1.weight", inter, h)
            mat(q + "w3.weight", inter, h)
            mat(q + "w2.weight", h, inter)
    norm("model.norm.weight", h)
    mat("lm_head.weight", c["vocab_size"], h, 6.0 / h**0.5)
    shutil.rmtree(hf_dir, ignore_errors=True)
    os.makedirs(hf_dir)
    save_file({k: v.contiguous() for k, v in t.items()}, os.path.join(hf_dir, "model.safetensors"),
              metadata={"format": "pt"})
    with open(os.path.join(hf_dir, "config.json"), "w") as f:
        json.dump(MINIMAX, f, indent=1)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(fam.TINY, f), os.path.join(hf_dir, f))


def minimax(llama_cpp, exe, work, prompt, seq, gcc_cmd, lib_dir):
    out_dir = os.path.join(FAMILIES_DIR, "minimax-m2")
    os.makedirs(out_dir, exist_ok=True)
    hf_dir, f32 = os.path.join(work, "minimax-m2"), os.path.join(work, "minimax-m2-f32.gguf")
    found = []
    for seed in MINIMAX_SEEDS:
        minimax_checkpoint(seed, hf_dir)
        fam.convert(llama_cpp, hf_dir, f32)
        out = fam.run_harness(exe, f32, prompt, seq)
        score = fam.llama_score(out)
        ok = len(set(out["greedy"])) >= NEW_TOKENS // 2
        print(f"  minimax-m2 seed={seed}: F32 score {score:.4f} distinct {len(set(out['greedy']))}", flush=True)
        if ok:
            found.append((score, seed))
    found.sort(key=lambda x: (-x[0], x[1]))
    best = None
    for _, seed in found[:SHORTLIST]:
        minimax_checkpoint(seed, hf_dir)
        fam.convert(llama_cpp, hf_dir, f32)
        scores = {"F32": fam.llama_score(fam.run_harness(exe, f32, prompt, seq))}
        for q in MINIMAX_QTYPES:
            qpath = os.path.join(work, f"cand-{q}.gguf")
            fam.quantize(f32, qpath, q)
            scores[q] = fam.llama_score(fam.run_harness(exe, qpath, prompt, seq))
        score = min(scores.values())
        print(f"  minimax-m2 seed={seed}: " + ", ".join(f"{q} {v:.4f}" for q, v in scores.items()), flush=True)
        if best is None or score > best[0]:
            best = (score, seed, scores)
    score, seed, scores = best
    minimax_checkpoint(seed, hf_dir)
    fam.convert(llama_cpp, hf_dir, f32)
    paths = {"F32": os.path.join(out_dir, "minimax-m2-tiny-f32.gguf")}
    shutil.copy(f32, paths["F32"])
    for q in MINIMAX_QTYPES:
        paths[q] = os.path.join(out_dir, f"minimax-m2-tiny-{q.lower()}.gguf")
        fam.quantize(f32, paths[q], q)
    files = {}
    for qtype, path in paths.items():
        files[os.path.basename(path)] = file_entry("minimax-m2", llama_cpp, exe, path, prompt, seq, qtype)
    checks = {}
    tf5 = os.environ.get("TF5_PATH")
    if tf5:
        import subprocess

        env = dict(fam.ENV, PYTHONPATH=tf5)
        res = subprocess.run([sys.executable, "-c", TF5_RUNNER, hf_dir, json.dumps(prompt), json.dumps(seq),
                              str(NEW_TOKENS)], check=True, env=env, capture_output=True, text=True)
        hf = json.loads(res.stdout.strip().splitlines()[-1])
        f32_out = files["minimax-m2-tiny-f32.gguf"]
        checks["minimax-m2-tiny-f32.gguf"] = dict(
            oracle=f"transformers {hf['version']} MiniMaxM2ForCausalLM on the same checkpoint (f32, eager)",
            tf_argmax_mismatches=sum(a != b for a, b in zip(f32_out["tf_seq_argmax"], hf["tf_pred"])),
            greedy_mismatches=sum(a != b for a, b in zip(f32_out["greedy"], hf["greedy"])),
            logits_first_max_abs_diff=max(abs(a - b) for a, b in zip(f32_out["logits_first"], hf["logits_first"])),
            logits_last_max_abs_diff=max(abs(a - b) for a, b in zip(f32_out["logits_last_seq"], hf["logits_last"])),
        )
        print("cross-check", checks, flush=True)
    ref = dict(
        generator=generator_info(llama_cpp, gcc_cmd, lib_dir, work),
        prompt_ids=prompt, full_ids=seq, new_tokens=NEW_TOKENS, files=files,
        families={"minimax-m2": dict(config=MINIMAX, seed=seed, llama_scores=scores, score=score)},
        cross_checks=checks,
    )
    with open(os.path.join(out_dir, "REF.json"), "w") as f:
        json.dump(ref, f)
        f.write("\n")


def file_entry(family, llama_cpp, exe, path, prompt, seq, qtype):
    out = fam.run_harness(exe, path, prompt, seq)
    entry = dict(
        family=family, size=os.path.getsize(path), model_desc=out["model_desc"],
        tensor_types=fam.tensor_types(llama_cpp, path), greedy=out["greedy"],
        greedy_margin=out["greedy_margin"], tf_argmax=out["tf_argmax"], tf_margin=out["tf_margin"],
        tf_router_gap=out["tf_router_gap"], min_router_gap_greedy=out["min_router_gap_greedy"],
        logits_first=out["logits_first"], logits_last=out["logits_last"],
        tf_seq_argmax=out["tf_seq_argmax"], tf_seq_margin=out["tf_seq_margin"],
        logits_last_seq=out["logits_last_seq"],
        made_by="converter --outtype f32" if qtype == "F32" else f"llama_model_quantize {qtype} of the F32 file",
    )
    SETTINGS.update(out["settings"])
    print(f"{os.path.basename(path)}: {entry['size']} bytes, min margin greedy "
          f"{min(out['greedy_margin']):.4f} tf_seq {min(out['tf_seq_margin']):.4f}", flush=True)
    return entry


SETTINGS = {}


def generator_info(llama_cpp, gcc_cmd, lib_dir, work):
    import numpy
    import safetensors
    import torch
    import transformers

    return dict(
        script="tools/make_gguf_gptoss_minimax_fixtures.py", harness="tools/gguf_ref.c",
        llama_cpp="vendored by llama-cpp-python 0.3.36",
        libllama=os.path.basename(os.path.realpath(os.path.join(lib_dir, "libllama.so"))),
        torch=torch.__version__, transformers=transformers.__version__,
        safetensors=safetensors.__version__, numpy=numpy.__version__,
        compile=" ".join(a.replace(llama_cpp, "$LLAMA_CPP_SRC").replace(lib_dir, "$LLAMA_LIB")
                         .replace(work, "$WORK").replace(REPO + "/", "") for a in gcc_cmd),
        settings=dict(SETTINGS),
    )


FP4_VALUES = [+0.0, +0.5, +1.0, +1.5, +2.0, +3.0, +4.0, +6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def mxfp4_pack(w):
    """[E, R, C] -> (blocks [E, R, C/32, 16] u8, scales [E, R, C/32] u8) and the
    dequantized tensor, as the published checkpoints store experts: per block
    of 32 values a power-of-two scale 2^(s-127), values the nearest FP4
    (e2m1), two to a byte, the even value in the low nibble."""
    import torch

    e, rows, cols = w.shape
    g = w.reshape(e, rows, cols // 32, 32).double()
    amax = g.abs().amax(dim=-1, keepdim=True).clamp(min=2.0**-100)
    k = torch.ceil(torch.log2(amax / 6.0))
    lut = torch.tensor(FP4_VALUES, dtype=torch.float64)
    idx = (((g / torch.pow(2.0, k)).unsqueeze(-1) - lut).abs()).argmin(dim=-1)
    deq = (lut[idx] * torch.pow(2.0, k)).reshape(e, rows, cols).float()
    idx = idx.to(torch.uint8)
    blocks = (idx[..., 0::2] | (idx[..., 1::2] << 4)).contiguous()
    scales = (k.squeeze(-1) + 127).to(torch.uint8).contiguous()
    return blocks, scales, deq


def save_mxfp4(model, hf_dir):
    """The published checkpoints' layout: experts as MXFP4 `_blocks` /
    `_scales` (output-major, gate and up interleaved by row), everything
    else F32, `quantization_config.quant_method: mxfp4`; the model's own
    experts replaced by their dequantized values, so transformers runs
    exactly what the checkpoint holds."""
    import torch
    from safetensors.torch import save_file

    packed = {}
    with torch.no_grad():
        for li, layer in enumerate(model.model.layers):
            ex = layer.mlp.experts
            for attr in ("gate_up_proj", "down_proj"):
                p = getattr(ex, attr)
                blocks, scales, deq = mxfp4_pack(p.data.transpose(1, 2).contiguous())
                p.data.copy_(deq.transpose(1, 2))
                packed[f"model.layers.{li}.mlp.experts.{attr}_blocks"] = blocks
                packed[f"model.layers.{li}.mlp.experts.{attr}_scales"] = scales
    shutil.rmtree(hf_dir, ignore_errors=True)
    os.makedirs(hf_dir)
    model.config.architectures = ["GptOssForCausalLM"]
    model.config.save_pretrained(hf_dir)
    cfg_path = os.path.join(hf_dir, "config.json")
    cfg = json.load(open(cfg_path))
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=1)
    tensors = {n: t.detach().float().contiguous().clone() for n, t in model.state_dict().items()
               if not (n.endswith("experts.gate_up_proj") or n.endswith("experts.down_proj"))}
    tensors.update(packed)
    save_file(tensors, os.path.join(hf_dir, "model.safetensors"), metadata={"format": "pt"})
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(fam.TINY, f), os.path.join(hf_dir, f))


def gpt_oss(llama_cpp, exe, work, prompt, seq, gcc_cmd, lib_dir):
    os.makedirs(OUT, exist_ok=True)
    print("gpt-oss: searching", flush=True)
    hf, f32 = search(llama_cpp, exe, work, prompt, seq)
    paths = {"F32": os.path.join(OUT, "gpt-oss-tiny-f32.gguf")}
    shutil.copy(f32, paths["F32"])
    for q in QTYPES:
        paths[q] = os.path.join(OUT, f"gpt-oss-tiny-{q.lower()}.gguf")
        fam.quantize(f32, paths[q], q)
    files = {}
    for qtype, path in paths.items():
        files[os.path.basename(path)] = file_entry("gpt-oss", llama_cpp, exe, path, prompt, seq, qtype)
    # The published checkpoints' MXFP4 experts, repacked by the converter
    # itself (not requantized): the same seed, F32 elsewhere.
    model = build(hf["seed"])
    mx_dir = os.path.join(work, "gpt-oss-mxfp4-src")
    save_mxfp4(model, mx_dir)
    mx = os.path.join(OUT, "gpt-oss-tiny-mxfp4-src.gguf")
    fam.convert(llama_cpp, mx_dir, mx)
    files[os.path.basename(mx)] = file_entry("gpt-oss", llama_cpp, exe, mx, prompt, seq, "F32")
    files[os.path.basename(mx)]["made_by"] = "converter --outtype f32 from the MXFP4 checkpoint (experts repacked as MXFP4)"
    hf_mx = hf_evaluate(model, prompt, seq)
    mx_out = files[os.path.basename(mx)]
    f32_out = files["gpt-oss-tiny-f32.gguf"]
    checks = {"gpt-oss-tiny-mxfp4-src.gguf": dict(
        oracle="transformers 4.57.1 GptOssForCausalLM on the MXFP4 checkpoint's dequantized experts (f32, eager)",
        tf_argmax_mismatches=sum(a != b for a, b in zip(mx_out["tf_seq_argmax"], hf_mx["tf_pred"])),
        greedy_mismatches=sum(a != b for a, b in zip(mx_out["greedy"], hf_mx["greedy"])),
        logits_first_max_abs_diff=max(abs(a - b) for a, b in zip(mx_out["logits_first"], hf_mx["logits_first"])),
        logits_last_max_abs_diff=max(abs(a - b) for a, b in zip(mx_out["logits_last_seq"], hf_mx["logits_last"])),
    )}
    checks["gpt-oss-tiny-f32.gguf"] = dict(
        oracle="transformers 4.57.1 GptOssForCausalLM on the same checkpoint (f32, eager)",
        tf_argmax_mismatches=sum(a != b for a, b in zip(f32_out["tf_seq_argmax"], hf["tf_pred"])),
        greedy_mismatches=sum(a != b for a, b in zip(f32_out["greedy"], hf["greedy"])),
        logits_first_max_abs_diff=max(abs(a - b) for a, b in zip(f32_out["logits_first"], hf["logits_first"])),
        logits_last_max_abs_diff=max(abs(a - b) for a, b in zip(f32_out["logits_last_seq"], hf["logits_last"])),
    )
    print("cross-check", checks, flush=True)
    ref = dict(
        generator=generator_info(llama_cpp, gcc_cmd, lib_dir, work),
        prompt_ids=prompt, full_ids=seq, new_tokens=NEW_TOKENS, files=files,
        families={"gpt-oss": dict(
            config=GPTOSS, seed=hf["seed"], hf_greedy=hf["greedy"], hf_tf_pred=hf["tf_pred"],
            hf_min_router_gap=hf["min_router_gap"], llama_scores=hf["llama_scores"], score=hf["score"],
        )},
        cross_checks=checks,
    )
    with open(os.path.join(OUT, "REF.json"), "w") as f:
        json.dump(ref, f)
        f.write("\n")


def main():
    args = sys.argv[1:]
    only = None
    if len(args) >= 2 and args[0] == "--only":
        only, args = args[1], args[2:]
    if len(args) not in (1, 2) or only not in (None, "gpt-oss", "minimax-m2"):
        sys.exit("usage: make_gguf_gptoss_minimax_fixtures.py [--only gpt-oss|minimax-m2] LLAMA_CPP_SRC [WORK_DIR]")
    llama_cpp = os.path.abspath(args[0])
    import llama_cpp as bindings

    lib_dir = os.path.join(os.path.dirname(bindings.__file__), "lib")
    tmp = None
    if len(args) == 2:
        work = os.path.abspath(args[1])
        os.makedirs(work, exist_ok=True)
    else:
        tmp = tempfile.TemporaryDirectory()
        work = tmp.name
    ref_tiny = json.load(open(os.path.join(fam.TINY, "REF.json")))
    prompt, seq = ref_tiny["prompt_ids"], ref_tiny["full_ids"]
    exe, gcc_cmd = fam.build_harness(llama_cpp, lib_dir, work)
    if only in (None, "gpt-oss"):
        gpt_oss(llama_cpp, exe, work, prompt, seq, gcc_cmd, lib_dir)
    if only in (None, "minimax-m2"):
        minimax(llama_cpp, exe, work, prompt, seq, gcc_cmd, lib_dir)
    if tmp is not None:
        tmp.cleanup()

if __name__ == "__main__":
    main()
