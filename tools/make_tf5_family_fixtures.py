#!/usr/bin/env python3
# Oracle fixtures for GLM-4.7-Flash (model_type "glm4_moe_lite"),
# DeepSeek-V3.2 ("deepseek_v32") and MiniMax-M2 ("minimax_m2"), written by
# transformers 5: a tiny random-weight Glm4MoeLiteForCausalLM /
# DeepseekV32ForCausalLM / MiniMaxM2ForCausalLM saved with
# save_pretrained (transformers 5's config spelling and tensor layout),
# reloaded, and run by transformers. REF.json has the format of the other
# fixture scripts (docs/formats.md): prompt_ids, full_ids (greedy
# continuation), tf_pred (teacher-forced argmax at every position), and the
# int8 round-trip oracle `int8_full_ids` / `int8_tf_pred`: the same two runs
# on a copy whose matrices went through the int8 round trip the engine
# applies at `--expert-bits 8 --dense-bits 8` (per output row: scale =
# amax/127, round half to even, clamp to [-128, 127]; the router
# `mlp.gate.weight`, the DSA indexer's `weights_proj`, norms and the
# correction bias stay f32).
# `logits_last` / `int8_logits_last` are the logits at the last position.
#
# Pinned versions (fixtures/glm4-moe-lite-tiny, deepseek-v32-tiny and
# minimax-m2-tiny were produced with exactly these):
#   torch==2.9.1  transformers==5.23.0  safetensors==0.8.0  numpy==2.4.6
# Run (CPU only, deterministic):
#   OMP_NUM_THREADS=1 python tools/make_tf5_family_fixtures.py [--out fixtures] [--only deepseek-v32-tiny]
#
# What it exercises: MLA with low-rank queries (q_a/q_b), the kv latent and
# interleaved RoPE on the rope head, v_head_dim != qk_nope_head_dim, the
# sigmoid router with a random e_score_correction_bias, normalised top-k and
# routed_scaling_factor, a shared expert, `mlp_layer_types` with a dense
# layer in the middle of sparse ones, and RoPE given as `rope_parameters`.
# DeepSeek-V3.2 adds the DSA lightning indexer on every layer (rotate-half
# RoPE on its rope dims, a LayerNorm key, ReLU scores weighted per head),
# with index_topk 8 below the 28 positions, so from the ninth position on
# attention reads only the selected ones; and two expert groups with
# topk_group 1. MiniMax-M2 is Mixtral-shaped (every layer routed, experts
# under block_sparse_moe.experts.E.w1/w2/w3) with GQA 4/2, q/k RMSNorm over
# the whole projection, partial rotary 0.5 and the sigmoid router whose
# correction bias chooses the experts.
import argparse
import copy
import json
import os
import shutil
import sys

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch
import transformers
from transformers import (
    AutoModelForCausalLM,
    DeepseekV32Config,
    DeepseekV32ForCausalLM,
    Glm4MoeLiteConfig,
    Glm4MoeLiteForCausalLM,
    MiniMaxM2Config,
    MiniMaxM2ForCausalLM,
)

torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)

NEW_TOKENS = 16

CONFIG = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=48,
    moe_intermediate_size=16,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=4,
    n_shared_experts=1,
    n_routed_experts=8,
    routed_scaling_factor=1.8,
    kv_lora_rank=32,
    q_lora_rank=24,
    qk_rope_head_dim=8,
    v_head_dim=12,
    qk_nope_head_dim=16,
    n_group=1,
    topk_group=1,
    num_experts_per_tok=2,
    norm_topk_prob=True,
    mlp_layer_types=["dense", "sparse", "dense", "sparse"],
    max_position_embeddings=256,
    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    rope_interleave=True,
    attention_bias=False,
    bos_token_id=0,
    eos_token_id=1,
    pad_token_id=1,
)


DSV32 = dict(
    CONFIG,
    n_group=2,
    topk_group=1,
    routed_scaling_factor=2.5,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    index_topk=8,
    index_head_dim=16,
    # Eight indexer heads, so that ReLU's exact zeros rarely tie at the
    # selection's boundary (the gap is measured and required below).
    index_n_heads=8,
    first_k_dense_replace=1,
)
del DSV32["rope_interleave"]

MINIMAX = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=16,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    num_local_experts=8,
    num_experts_per_tok=2,
    max_position_embeddings=256,
    rope_parameters={"rope_type": "default", "rope_theta": 5000000.0, "partial_rotary_factor": 0.5},
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    bos_token_id=0,
    eos_token_id=1,
    pad_token_id=1,
)

# fixture -> (config class, model class, config)
KINDS = {
    "glm4-moe-lite-tiny": (Glm4MoeLiteConfig, Glm4MoeLiteForCausalLM, CONFIG),
    "deepseek-v32-tiny": (DeepseekV32Config, DeepseekV32ForCausalLM, DSV32),
    "minimax-m2-tiny": (MiniMaxM2Config, MiniMaxM2ForCausalLM, MINIMAX),
}


def build(kind, seed, scale):
    torch.manual_seed(seed)
    config_cls, model_cls, config = KINDS[kind]
    cfg = config_cls(**config)
    model = model_cls._from_config(cfg, attn_implementation="eager", dtype=torch.float32).eval()
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


def is_router(name):
    # The indexer's per-head weighting is read as F32 too, like the router.
    return name.endswith("mlp.gate.weight") or name.endswith("indexer.weights_proj.weight")


def int8_copy(model):
    """Every matrix the engine quantizes replaced by its int8 round trip
    (the fused 3-D expert tensors row by row, as the engine does per expert)."""
    q = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in q.named_parameters():
            if p.dim() < 2 or is_router(name):
                continue
            w = p.data.float()
            scale = (w.abs().amax(dim=-1, keepdim=True) / 127.0).clamp(min=1e-8)
            p.data.copy_(torch.round(w / scale).clamp(-128, 127) * scale)
    return q


class Probe:
    """Smallest decision gaps of a no-cache forward: the router's (group
    choice, expert choice, on the corrected scores) and the DSA indexer's
    (k-th against (k+1)-th score among the causally visible keys)."""

    def __init__(self, model):
        self.router_gap = float("inf")
        self.group_gap = float("inf")
        self.index_gap = float("inf")
        self.handles = []
        for layer in model.model.layers:
            ix = getattr(layer.self_attn, "indexer", None)
            if ix is not None:
                self.handles.append(ix.register_forward_hook(self.indexer_hook, with_kwargs=True))
            if hasattr(layer.mlp, "gate"):
                # MiniMax-M2 keeps the correction bias on the block, not the router.
                bias = getattr(layer.mlp.gate, "e_score_correction_bias", None)
                if bias is None:
                    bias = layer.mlp.e_score_correction_bias
                hook = lambda mod, inp, out, bias=bias: self.router_hook(mod, inp, bias)
                self.handles.append(layer.mlp.gate.register_forward_hook(hook))

    def indexer_hook(self, mod, args, kwargs, out):
        from transformers.models.deepseek_v32.modeling_deepseek_v32 import apply_rotary_pos_emb

        names = ["hidden_states", "q_resid", "position_embeddings", "attention_mask", "position_ids"]
        a = dict(zip(names, args))
        a.update(kwargs)
        hs, q_resid = a["hidden_states"], a["q_resid"]
        cos, sin = a["position_embeddings"]
        b, n, _ = hs.shape
        rd = mod.qk_rope_head_dim
        q = mod.wq_b(q_resid).view(b, n, mod.n_heads, mod.head_dim)
        q_rot, q_pass = torch.split(q, [rd, mod.head_dim - rd], dim=-1)
        k = mod.k_norm(mod.wk(hs)).unsqueeze(2)
        k_rot, k_pass = torch.split(k, [rd, mod.head_dim - rd], dim=-1)
        q_rot, k_rot = apply_rotary_pos_emb(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
        q = torch.cat([q_rot, q_pass], dim=-1)
        k = torch.cat([k_rot, k_pass], dim=-1).squeeze(2)
        scores = torch.relu(torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * mod.softmax_scale)
        w = mod.weights_proj(hs).float() * (mod.n_heads**-0.5)
        idx = torch.matmul(w.unsqueeze(-2), scores).squeeze(-2)[0]
        kk = mod.index_topk
        for t in range(n):
            if t + 1 > kk:
                top = torch.topk(idx[t, : t + 1], kk + 1).values
                self.index_gap = min(self.index_gap, (top[kk - 1] - top[kk]).item())

    def router_hook(self, mod, _inp, bias):
        x = _inp[0].reshape(-1, mod.weight.shape[1]).float()
        scores = torch.nn.functional.linear(x, mod.weight.float()).sigmoid()
        sfc = scores + bias
        e, g = mod.num_experts, getattr(mod, "num_group", 1)
        if g > 1:
            grp = sfc.view(-1, g, e // g).topk(2, dim=-1)[0].sum(-1)
            top = torch.topk(grp, mod.topk_group + 1, dim=-1).values
            self.group_gap = min(self.group_gap, (top[:, -2] - top[:, -1]).min().item())
            gidx = torch.topk(grp, mod.topk_group, dim=-1)[1]
            mask = torch.zeros_like(grp).scatter_(1, gidx, 1).unsqueeze(-1).expand(-1, g, e // g).reshape(-1, e)
            sfc = sfc.masked_fill(~mask.bool(), float("-inf"))
        k = mod.top_k
        top = torch.topk(sfc, k + 1, dim=-1).values
        self.router_gap = min(self.router_gap, (top[:, k - 1] - top[:, k]).min().item())

    def close(self):
        for h in self.handles:
            h.remove()


def gaps(model, ids):
    probe = Probe(model)
    with torch.no_grad():
        model(torch.tensor([ids]))
    probe.close()
    return dict(min_router_gap=probe.router_gap, min_group_gap=probe.group_gap, min_index_gap=probe.index_gap)


def evaluate(model, prompt):
    with torch.no_grad():
        ids = list(prompt)
        margins = []
        for _ in range(NEW_TOKENS):
            logits = model(torch.tensor([ids])).logits[0, -1].double()
            top = torch.topk(logits, 2).values
            margins.append(float(top[0] - top[1]))
            ids.append(int(torch.argmax(logits)))
        full = model(torch.tensor([ids])).logits[0].double()
        tf = [int(x) for x in torch.argmax(full, dim=-1)]
        top2 = torch.topk(full, 2, dim=-1).values
        tf_margins = [float(x) for x in (top2[:, 0] - top2[:, 1])]
    return dict(
        **gaps(model, ids),
        full_ids=ids,
        tf_pred=tf,
        gen_min_margin=min(margins),
        tf_min_margin=min(tf_margins),
        distinct=len(set(ids[len(prompt):])),
        logits_last=full[-1].float().tolist(),
    )


def make(kind, args):
    prompt = [5, 17, 42, 99, 3, 250, 77, 12, 64, 128, 31, 200]
    first, last = (int(x) for x in args.seeds.split(":"))
    d = os.path.join(os.path.abspath(args.out), kind)
    for seed in range(first, last):
        model = build(kind, seed, args.scale)
        # The oracle is the checkpoint as written, reloaded.
        shutil.rmtree(d, ignore_errors=True)
        model.save_pretrained(d)
        model = AutoModelForCausalLM.from_pretrained(
            d, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager"
        ).eval()
        r = evaluate(model, prompt)
        q = evaluate(int8_copy(model), prompt)
        gap = min(r[k] for k in ["min_router_gap", "min_group_gap", "min_index_gap"])
        gap8 = min(q[k] for k in ["min_router_gap", "min_group_gap", "min_index_gap"])
        ok = (
            min(r["gen_min_margin"], r["tf_min_margin"], q["gen_min_margin"], q["tf_min_margin"]) > 0.02
            and min(gap, gap8) > 1e-3
            and r["distinct"] >= NEW_TOKENS // 2
        )
        print(
            f"seed={seed} margins f32 {r['gen_min_margin']:.4f}/{r['tf_min_margin']:.4f} "
            f"int8 {q['gen_min_margin']:.4f}/{q['tf_min_margin']:.4f} distinct={r['distinct']} "
            f"gaps router/group/index {r['min_router_gap']:.4f}/{r['min_group_gap']:.4f}/{r['min_index_gap']:.4f} "
            f"int8 {q['min_router_gap']:.4f}/{q['min_group_gap']:.4f}/{q['min_index_gap']:.4f}",
            flush=True,
        )
        if ok:
            break
    else:
        shutil.rmtree(d, ignore_errors=True)
        raise SystemExit("no candidate met the criteria")
    ref = {
        "prompt_ids": prompt,
        "full_ids": r["full_ids"],
        "tf_pred": r["tf_pred"],
        "int8_full_ids": q["full_ids"],
        "int8_tf_pred": q["tf_pred"],
        "dtype": "f32",
        "new_tokens": NEW_TOKENS,
        "gen_min_margin": r["gen_min_margin"],
        "tf_min_margin": r["tf_min_margin"],
        "int8_gen_min_margin": q["gen_min_margin"],
        "int8_tf_min_margin": q["tf_min_margin"],
        **{k: r[k] for k in ["min_router_gap", "min_group_gap", "min_index_gap"] if r[k] != float("inf")},
        **{"int8_" + k: q[k] for k in ["min_router_gap", "min_group_gap", "min_index_gap"] if q[k] != float("inf")},
        "logits_last": r["logits_last"],
        "int8_logits_last": q["logits_last"],
        "generator": {
            "script": "tools/make_tf5_family_fixtures.py",
            "fixture": kind,
            "seed": seed,
            "scale": args.scale,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "attn_implementation": "eager",
            "experts_implementation": "eager",
        },
    }
    with open(os.path.join(d, "REF.json"), "w") as f:
        json.dump(ref, f)
        f.write("\n")
    cfg = json.load(open(os.path.join(d, "config.json")))
    print(f"{kind}: chose seed={seed}; config keys: {sorted(cfg)}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures"))
    ap.add_argument("--seeds", default="1:200", help="first:last seed tried, in order")
    ap.add_argument("--scale", type=float, default=1.5)
    ap.add_argument("--only", default=None, choices=sorted(KINDS))
    args = ap.parse_args()
    assert transformers.__version__.startswith("5."), transformers.__version__
    for kind in KINDS:
        if args.only is None or args.only == kind:
            make(kind, args)


if __name__ == "__main__":
    sys.exit(main())
