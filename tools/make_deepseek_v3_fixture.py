#!/usr/bin/env python3
# Oracle fixture for the DeepSeek-V3 arm of the GLM engine (model_type
# "deepseek_v3"): a tiny random-weight DeepseekV3ForCausalLM checkpoint and a
# transformers-produced REF.json (prompt_ids, full_ids = greedy continuation,
# tf_pred = teacher-forced argmax at every position), plus an exact oracle for
# the int8 path: `int8_full_ids` / `int8_tf_pred` are the same two runs on a
# copy whose matrices went through the int8 round trip the engine applies at
# `--expert-bits 8 --dense-bits 8` (per output row: scale = amax/127, round
# half to even, clamp to [-128, 127]). The engine quantizes every matrix of
# the GLM / DeepSeek-V3 arm but the router (`mlp.gate.weight`): embeddings,
# q_a/q_b, kv_a_proj_with_mqa, kv_b, o_proj, the dense and shared MLPs, the
# routed experts and lm_head (src/convert/glm.rs keeps vectors and routers
# F32); norms and e_score_correction_bias stay f32. `logits_last` /
# `int8_logits_last` are the logits at the last position of `full_ids` /
# `int8_full_ids` (this seed's int8 tokens equal its f32 tokens, so the tests
# also compare these logits, which do tell int8 weights from f32 ones).
#
# Pinned versions (fixtures/deepseek-v3-tiny was produced with exactly these):
#   torch==2.9.1  transformers==4.57.1  safetensors (any 0.4+)
# Run (CPU only, deterministic):
#   OMP_NUM_THREADS=1 python tools/make_deepseek_v3_fixture.py [--out fixtures]
#
# What it exercises: MLA (q_a/q_b low rank, kv latent, interleaved rope),
# no DSA indexer, the sigmoid router with a random e_score_correction_bias,
# n_group > 1 with topk_group < n_group, normalised top-k,
# routed_scaling_factor, a shared expert, first_k_dense_replace = 1, and
# GQA-free MLA heads with v_head_dim != qk_nope_head_dim.
import argparse
import copy
import json
import os
import shutil
import sys

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch
from safetensors.torch import save_file
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)

NEW_TOKENS = 20

CONFIG = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=48,
    moe_intermediate_size=16,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=4,
    n_shared_experts=1,
    n_routed_experts=8,
    routed_scaling_factor=2.5,
    kv_lora_rank=32,
    q_lora_rank=24,
    qk_rope_head_dim=8,
    v_head_dim=12,
    qk_nope_head_dim=16,
    n_group=2,
    topk_group=1,
    num_experts_per_tok=2,
    first_k_dense_replace=1,
    norm_topk_prob=True,
    max_position_embeddings=128,
    rope_theta=10000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    rope_interleave=True,
    attention_bias=False,
    bos_token_id=0,
    eos_token_id=1,
    pad_token_id=1,
)


def build(seed, scale):
    torch.manual_seed(seed)
    cfg = DeepseekV3Config(**CONFIG)
    cfg._attn_implementation = "eager"
    model = DeepseekV3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * scale / (p.shape[-1] ** 0.5))
        for m in model.modules():
            if hasattr(m, "e_score_correction_bias"):
                m.e_score_correction_bias.copy_(0.2 * torch.randn_like(m.e_score_correction_bias))
    return model


def int8_copy(model):
    """Every matrix the engine quantizes replaced by its int8 round trip."""
    q = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in q.named_parameters():
            if p.dim() != 2 or name.endswith("mlp.gate.weight"):
                continue
            w = p.data.float()
            scale = (w.abs().amax(dim=-1, keepdim=True) / 127.0).clamp(min=1e-8)
            p.data.copy_(torch.round(w / scale).clamp(-128, 127) * scale)
    return q


def evaluate(model, prompt):
    with torch.no_grad():
        ids = list(prompt)
        margins = []
        for _ in range(NEW_TOKENS):
            logits = model(torch.tensor([ids])).logits[0, -1].double()
            top = torch.topk(logits, 2).values
            margins.append(float(top[0] - top[1]))
            nxt = int(torch.argmax(logits))
            if nxt == CONFIG["eos_token_id"]:
                return None
            ids.append(nxt)
        full = model(torch.tensor([ids])).logits[0].double()
        tf = [int(x) for x in torch.argmax(full, dim=-1)]
        top2 = torch.topk(full, 2, dim=-1).values
        margins += [float(x) for x in (top2[:, 0] - top2[:, 1])]
    return ids, tf, min(margins), len(set(ids[len(prompt):])), full[-1].float().tolist()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "fixtures"))
    # The committed fixture is seed 75: seeds were tried with this script and
    # each kept candidate checked with `coli validate --expert-bits 8
    # --dense-bits 8` (greedy and --teacher-forcing); 75 is the first whose
    # int8 copy reproduces the reference exactly (59 and 136 diverged), so the
    # fixture also serves the int8 tests.
    ap.add_argument("--seeds", default="75:76", help="first:last seed tried, in order")
    ap.add_argument("--scales", default="1.0,1.5,2.0")
    args = ap.parse_args()
    prompt = [5, 17, 42, 99, 3, 250, 77, 12]
    first, last = (int(x) for x in args.seeds.split(":"))
    chosen = None
    for scale in [float(x) for x in args.scales.split(",")]:
        for seed in range(first, last):
            model = build(seed, scale)
            r = evaluate(model, prompt)
            if r is None:
                continue
            full, tf, margin, distinct, logits_last = r
            print(f"seed={seed} scale={scale} margin={margin:.4f} distinct={distinct}", flush=True)
            if margin > 0.05 and distinct >= NEW_TOKENS // 2:
                chosen = (seed, scale, model, full, tf, margin, logits_last)
                break
        if chosen:
            break
    if chosen is None:
        raise SystemExit("no candidate met the criteria")
    seed, scale, model, full, tf, margin, logits_last = chosen
    q = evaluate(int8_copy(model), prompt)
    if q is None:
        raise SystemExit("the int8 copy generated eos")
    int8_full, int8_tf, int8_margin, _, int8_logits_last = q
    print(
        f"int8 oracle: min_margin={int8_margin:.4f} equal_to_f32={int8_full == full and int8_tf == tf}",
        flush=True,
    )
    d = os.path.join(os.path.abspath(args.out), "deepseek-v3-tiny")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    model.config.save_pretrained(d)
    model.generation_config.save_pretrained(d)
    tensors = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    ref = {
        "prompt_ids": prompt,
        "full_ids": full,
        "tf_pred": tf,
        "int8_full_ids": int8_full,
        "int8_tf_pred": int8_tf,
        "dtype": "f32",
        "new_tokens": NEW_TOKENS,
        "min_margin": margin,
        "int8_min_margin": int8_margin,
        "logits_last": logits_last,
        "int8_logits_last": int8_logits_last,
        "generator": {
            "script": "tools/make_deepseek_v3_fixture.py",
            "seed": seed,
            "scale": scale,
            "torch": torch.__version__,
            "transformers": __import__("transformers").__version__,
            "attn_implementation": "eager",
        },
    }
    with open(os.path.join(d, "REF.json"), "w") as f:
        json.dump(ref, f)
        f.write("\n")
    print(f"chose seed={seed} scale={scale} min_margin={margin:.4f}")


if __name__ == "__main__":
    sys.exit(main())
