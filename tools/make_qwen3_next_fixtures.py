#!/usr/bin/env python3
# Oracle fixtures for the hybrid Qwen3-Next and Qwen3.5-MoE families, made and
# run by transformers 5: tiny random-weight Qwen3NextForCausalLM
# (fixtures/qwen3-next-tiny, `model_type` qwen3_next) and
# Qwen3_5MoeForConditionalGeneration (fixtures/qwen3-5-moe-tiny, `model_type`
# qwen3_5_moe: the multimodal release form, a config with nested
# `text_config` (qwen3_5_moe_text) and `vision_config`, and a one-block vision
# tower under `model.visual.*` that the text-only oracle never runs), written
# with save_pretrained (float32 safetensors, transformers 5's config spelling),
# reloaded, and run by transformers on text token ids. REF.json has the format
# of the other fixture scripts (docs/formats.md): greedy continuation,
# teacher-forced argmax, `logits_last`, and the int8 round-trip oracle
# (`int8_full_ids`, `int8_tf_pred`, `int8_logits_last`).
#
# Both stacks mix Gated DeltaNet linear-attention layers with gated full
# attention (q_proj gives query and a sigmoid output gate), and every MoE
# layer adds a shared expert scaled by sigmoid(shared_expert_gate). The
# prompt is 80 tokens, longer than the 64-token chunk of transformers' torch
# chunked delta rule, so prefill goes through two chunks and the 12 decode
# steps through the recurrent (token by token) rule; the script checks that
# transformers took exactly those torch paths (no flash-linear-attention,
# causal-conv1d or hub kernels), and checks the chunked prefill output of
# every linear-attention layer against a token-by-token gated delta rule
# written here in plain torch (max |difference| below 1e-4).
#
# The int8 round trip (what the engine applies at --expert-bits 8
# --dense-bits 8; per output row: scale = amax/127 clamped to >= 1e-8, round
# half to even, clamp to [-128, 127]) is applied to exactly these tensors (on
# disk names; L a layer, E an expert; for qwen3-5-moe-tiny every name below
# is prefixed `model.language_model.` instead of `model.`, and lm_head stays
# `lm_head.weight`):
#   model.embed_tokens.weight, lm_head.weight
#   model.layers.L.linear_attn.{in_proj_qkvz,in_proj_ba,out_proj}.weight      (qwen3_next)
#   model.layers.L.linear_attn.{in_proj_qkv,in_proj_z,in_proj_b,in_proj_a,out_proj}.weight (qwen3_5_moe)
#   model.layers.L.self_attn.{q_proj,k_proj,v_proj,o_proj}.weight
#   model.layers.L.mlp.experts.E.{gate_proj,up_proj,down_proj}.weight
#   model.layers.L.mlp.shared_expert.{gate_proj,up_proj,down_proj}.weight
#   model.layers.L.mlp.{gate_proj,up_proj,down_proj}.weight                  (qwen3_next dense layer 1)
# and these stay f32 (bit for bit as in model.safetensors):
#   model.layers.L.mlp.gate.weight                (router)
#   model.layers.L.mlp.shared_expert_gate.weight  ([1, hidden])
#   model.layers.L.linear_attn.conv1d.weight      ([conv_dim, 1, kernel])
#   model.layers.L.linear_attn.A_log, model.layers.L.linear_attn.dt_bias
#   every norm: input_layernorm, post_attention_layernorm, model.norm,
#     self_attn.q_norm, self_attn.k_norm, linear_attn.norm
#   model.visual.* (the vision tower; the text-only oracle does not run it)
# (In memory transformers 5 holds the routed experts stacked,
# mlp.experts.gate_up_proj [E, 2I, H] and mlp.experts.down_proj [E, H, I];
# a per-row round trip of those is the per-row round trip of each expert's
# gate_proj/up_proj/down_proj on disk.)
#
# Pinned versions (the numbers in fixtures/qwen3-next-tiny and
# fixtures/qwen3-5-moe-tiny were produced with exactly these):
#   torch==2.9.1 (CPU)  transformers==5.23.0  safetensors==0.8.0  tokenizers==0.23.3  numpy==2.4.6
#   no flash-linear-attention, causal-conv1d or kernels installed
# Run (CPU only, deterministic):
#   /work/venv/tf5/bin/python tools/make_qwen3_next_fixtures.py [--out fixtures] [--only qwen3-next-tiny]
import argparse
import copy
import inspect
import json
import os
import shutil
import sys

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import numpy as np
import torch
import torch.nn.functional as F
import transformers
from safetensors import safe_open
from transformers import (
    Qwen3_5MoeConfig,
    Qwen3_5MoeForConditionalGeneration,
    Qwen3NextConfig,
    Qwen3NextForCausalLM,
)
from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe
from transformers.models.qwen3_next import modeling_qwen3_next

torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
PROMPT_LEN = 80
NEW_TOKENS = 12
CHUNK = 64  # transformers' torch_chunk_gated_delta_rule default chunk_size

# The tokenizer (and its vocab size) of fixtures/qwen3-moe-tiny: ChatML
# specials <|endoftext|> <|im_start|> <|im_end|> as ids 0..2, 219 tokens in
# tokenizer.json, vocab_size 263 in the config.
TOKENIZER_FROM = "qwen3-moe-tiny"
VOCAB = 263
TOKENIZER_TOKENS = 219
COPIED = ["tokenizer.json", "tokenizer_config.json"]

COMMON_TEXT = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    num_attention_heads=4,
    num_key_value_heads=2,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=8,
    linear_value_head_dim=6,
    linear_conv_kernel_dim=4,
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=12,
    shared_expert_intermediate_size=16,
    hidden_act="silu",
    rms_norm_eps=1e-6,
    max_position_embeddings=512,
    tie_word_embeddings=False,
    bos_token_id=None,
    eos_token_id=2,
    pad_token_id=0,
)

SHAPES = {
    # 5 layers, full_attention_interval 4: linear, linear, linear, full,
    # linear. GQA 4/2 with head_dim 8 (q_proj 4*8*2 rows: query and gate per
    # head), partial rotary 0.5 (4 of 8 dims). Linear attention: 2 key heads
    # of 8, 4 value heads of 6 (2 value heads per key head). Top-2 of 8 with
    # norm_topk_prob; layer 1 a dense MLP (mlp_only_layers [1],
    # intermediate_size 24); untied head.
    "qwen3-next-tiny": dict(
        kind="qwen3_next",
        config=dict(
            COMMON_TEXT,
            num_hidden_layers=5,
            full_attention_interval=4,
            head_dim=8,
            intermediate_size=24,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[1],
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        ),
    ),
    # The multimodal release form. Text: 4 layers (linear x3, full), head_dim
    # 16 with partial rotary 0.5 (8 dims, 4 frequencies split by mrope_section
    # [2, 1, 1], interleaved), every layer MoE (qwen3_5_moe_text has no
    # mlp_only_layers / decoder_sparse_step / norm_topk_prob: it always
    # renormalises the top-k). Vision: the smallest tower transformers builds
    # (1 block of width 16), image/video/vision-start/end ids inside the vocab.
    "qwen3-5-moe-tiny": dict(
        kind="qwen3_5_moe",
        config=dict(
            COMMON_TEXT,
            num_hidden_layers=4,
            full_attention_interval=4,
            head_dim=16,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.5,
                "mrope_section": [2, 1, 1],
                "mrope_interleaved": True,
            },
        ),
        vision=dict(
            depth=1,
            hidden_size=16,
            intermediate_size=16,
            num_heads=2,
            patch_size=2,
            temporal_patch_size=2,
            spatial_merge_size=2,
            out_hidden_size=32,
            num_position_embeddings=16,
        ),
        tokens=dict(image_token_id=261, video_token_id=262, vision_start_token_id=259, vision_end_token_id=260),
    ),
}


def text_config(model):
    c = model.config
    return c.text_config if hasattr(c, "text_config") else c


def text_model(model):
    return model.model.language_model if hasattr(model.model, "language_model") else model.model


def is_router(name):
    return name.endswith("mlp.gate.weight")


def kept_f32(name):
    """Tensors the int8 round trip leaves alone (besides those with dim < 2)."""
    return (
        is_router(name)
        or name.endswith("mlp.shared_expert_gate.weight")
        or name.endswith("linear_attn.conv1d.weight")
        or name.endswith("A_log")
        or name.endswith("dt_bias")
        or "norm" in name.split(".")[-2]
        or name.startswith("model.visual.")
    )


def int8_copy(model):
    q = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in q.named_parameters():
            if p.dim() < 2 or kept_f32(name):
                continue
            w = p.data.float()
            scale = (w.abs().amax(dim=-1, keepdim=True) / 127.0).clamp(min=1e-8)
            p.data.copy_(torch.round(w / scale).clamp(-128, 127) * scale)
    return q


def build(name, seed, scale):
    spec = SHAPES[name]
    if spec["kind"] == "qwen3_next":
        cfg = Qwen3NextConfig(**spec["config"])
        cls = Qwen3NextForCausalLM
    else:
        cfg = Qwen3_5MoeConfig(
            text_config=dict(spec["config"]),
            vision_config=dict(spec["vision"]),
            tie_word_embeddings=False,
            **spec["tokens"],
        )
        cls = Qwen3_5MoeForConditionalGeneration
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"
    torch.manual_seed(seed)
    model = cls(cfg)
    model.eval()
    init_weights(model, torch.Generator().manual_seed(seed), scale)
    gc = model.generation_config
    gc.eos_token_id, gc.pad_token_id, gc.bos_token_id, gc.do_sample = 2, 0, None, False
    rng = np.random.default_rng(seed)
    prompt = [int(i) for i in rng.integers(3, TOKENIZER_TOKENS, size=PROMPT_LEN)]
    return model, cls, prompt


def init_weights(model, gen, scale):
    """Re-draw every parameter with decisive (non-default) scales. The
    zero-centred RMSNorms (weight used as 1 + w) get w ~ 0.25 N(0,1); the gated
    norm of linear attention (weight used as is) 1 + 0.25 N(0,1). A = exp(A_log)
    in [0.05, 1.5] and dt_bias ~ N(-1, 0.5): per-token decays exp(g) mostly in
    (0.3, 1), so the recurrent state carries across the 64-token chunk."""
    h = text_config(model).hidden_size

    def randn(shape):
        return torch.randn(shape, generator=gen)

    with torch.no_grad():
        for name, p in model.named_parameters():
            last = name.split(".")[-2] if name.endswith(".weight") else name.split(".")[-1]
            if name.startswith("model.visual."):
                p.copy_(randn(p.shape) * 0.1)
            elif name.endswith("linear_attn.norm.weight"):
                p.copy_(1.0 + 0.25 * randn(p.shape))
            elif "norm" in last:
                p.copy_(0.25 * randn(p.shape))
            elif name.endswith("A_log"):
                p.copy_(torch.log(0.05 + 1.45 * torch.rand(p.shape, generator=gen)))
            elif name.endswith("dt_bias"):
                p.copy_(-1.0 + 0.5 * randn(p.shape))
            elif name.endswith("conv1d.weight"):
                p.copy_(randn(p.shape) * (1.5 / p.shape[-1] ** 0.5))
            elif name.endswith("embed_tokens.weight"):
                p.copy_(randn(p.shape))
            elif name == "lm_head.weight":
                p.copy_(randn(p.shape) * (6.0 / h**0.5))
            elif is_router(name):
                p.copy_(randn(p.shape) * (2.0 / h**0.5))
            elif name.endswith("shared_expert_gate.weight"):
                p.copy_(randn(p.shape) * (3.0 / h**0.5))
            elif p.dim() in (2, 3):
                p.copy_(randn(p.shape) * (scale / p.shape[-1] ** 0.5))
            else:
                raise RuntimeError(f"unexpected parameter {name} {tuple(p.shape)}")


# ---- which code paths transformers takes -------------------------------------

PATH_FUNCS = ["torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn", "causal_conv1d_update"]


def assert_torch_paths():
    """Every kernel-or-torch function resolved to transformers' own torch code."""
    for mod in (modeling_qwen3_next, modeling_qwen3_5_moe):
        for f in PATH_FUNCS:
            fn = getattr(mod, f)
            nl = inspect.getclosurevars(fn).nonlocals
            assert nl["is_new_implementation"] is False, f"{mod.__name__}.{f} resolved to {nl['implementation']}"
            assert nl["implementation"] is fn.__wrapped__, f


class PathLog:
    """Counts calls (and sequence lengths, chunk sizes) of the delta-rule and
    conv functions by wrapping the module globals the layers call."""

    def __init__(self, mod):
        self.mod, self.calls, self.saved = mod, [], {}

    def __enter__(self):
        for f in PATH_FUNCS:
            orig = getattr(self.mod, f)
            self.saved[f] = orig

            def wrap(*a, _f=f, _orig=orig, **kw):
                seq = a[0].shape[1] if "delta" in _f else a[0].shape[-1]
                self.calls.append((_f, int(seq), kw.get("chunk_size", CHUNK if "chunk" in _f else None)))
                return _orig(*a, **kw)

            setattr(self.mod, f, wrap)
        return self

    def __exit__(self, *exc):
        for f, orig in self.saved.items():
            setattr(self.mod, f, orig)

    def summary(self):
        out = {}
        for f, seq, chunk in self.calls:
            key = f"{f}(seq={seq}" + (f", chunk_size={chunk})" if chunk else ")")
            out[key] = out.get(key, 0) + 1
        return out


def modeling_of(model):
    return modeling_qwen3_next if isinstance(model, Qwen3NextForCausalLM) else modeling_qwen3_5_moe


# ---- a plain-torch token-by-token Gated DeltaNet ------------------------------


def zc_rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + w)


def my_gated_deltanet(layer, x, cfg):
    """The linear-attention block on x [T, H], written out: projections,
    causal depthwise conv + SiLU, l2-normalised q/k, q scaled by dk^-1/2,
    state S [Hv, dk, dv] updated one token at a time:
        S <- exp(g_t) S;  S <- S + k_t (beta_t (v_t - S^T k_t))^T;  o_t = S^T q_t
    then the gated RMSNorm (norm(o) * w * silu(z)) and out_proj."""
    T = x.shape[0]
    nk, nv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    r = nv // nk
    if hasattr(layer, "in_proj_qkvz"):
        # qwen3_next: per key head g, rows [q_g (dk) | k_g (dk) | v_g (r*dv) | z_g (r*dv)];
        # in_proj_ba per key head [b_g (r) | a_g (r)].
        qkvz = (x @ layer.in_proj_qkvz.weight.T).view(T, nk, 2 * dk + 2 * r * dv)
        q, k, v, z = torch.split(qkvz, [dk, dk, r * dv, r * dv], dim=-1)
        ba = (x @ layer.in_proj_ba.weight.T).view(T, nk, 2 * r)
        b, a = ba[..., :r].reshape(T, nv), ba[..., r:].reshape(T, nv)
        q, k = q.reshape(T, nk * dk), k.reshape(T, nk * dk)
        v, z = v.reshape(T, nv * dv), z.reshape(T, nv, dv)
    else:
        # qwen3_5_moe: in_proj_qkv rows [q (nk*dk) | k (nk*dk) | v (nv*dv)], separate z, b, a.
        qkv = x @ layer.in_proj_qkv.weight.T
        q, k, v = torch.split(qkv, [nk * dk, nk * dk, nv * dv], dim=-1)
        z = (x @ layer.in_proj_z.weight.T).view(T, nv, dv)
        b, a = x @ layer.in_proj_b.weight.T, x @ layer.in_proj_a.weight.T
    mixed = torch.cat([q, k, v], dim=-1)  # [T, C], the conv's channel order
    w = layer.conv1d.weight[:, 0, :]  # [C, K]
    K = w.shape[1]
    padded = torch.cat([torch.zeros(K - 1, mixed.shape[1]), mixed], dim=0)
    conv = torch.stack([(padded[t : t + K] * w.T).sum(0) for t in range(T)])
    conv = F.silu(conv)
    q, k, v = torch.split(conv, [nk * dk, nk * dk, nv * dv], dim=-1)
    q, k, v = q.view(T, nk, dk), k.view(T, nk, dk), v.view(T, nv, dv)
    q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
    k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    q = q * dk**-0.5
    beta = torch.sigmoid(b)
    g = -torch.exp(layer.A_log) * F.softplus(a + layer.dt_bias)
    S = torch.zeros(nv, dk, dv)
    out = torch.zeros(T, nv, dv)
    for t in range(T):
        for hv in range(nv):
            hk = hv // r  # value head hv reads key head hv // r
            s = S[hv] * torch.exp(g[t, hv])
            kt, qt = k[t, hk], q[t, hk]
            delta = beta[t, hv] * (v[t, hv] - s.T @ kt)
            s = s + torch.outer(kt, delta)
            S[hv] = s
            out[t, hv] = s.T @ qt
    eps = layer.norm.variance_epsilon
    o = out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + eps) * layer.norm.weight * F.silu(z)
    return o.reshape(T, nv * dv) @ layer.out_proj.weight.T


def recurrent_check(model, prompt):
    """Each linear-attention layer's output in transformers' prefill (chunked,
    no cache) against my_gated_deltanet on the same input. Returns the max
    absolute difference per layer."""
    cfg = text_config(model)
    layers = text_model(model).layers
    inputs, outputs = {}, {}
    hooks = []
    for i, layer in enumerate(layers):
        if cfg.layer_types[i] != "linear_attention":
            continue

        def hook(_m, args, kwargs, out, i=i):
            inputs[i] = (kwargs.get("hidden_states", args[0] if args else None)).detach()[0]
            outputs[i] = out.detach()[0]

        hooks.append(layer.linear_attn.register_forward_hook(hook, with_kwargs=True))
    with torch.no_grad():
        model(torch.tensor([prompt]), use_cache=False)
    for h in hooks:
        h.remove()
    diffs = {}
    with torch.no_grad():
        for i in sorted(inputs):
            mine = my_gated_deltanet(layers[i].linear_attn, inputs[i], cfg)
            diffs[i] = (mine - outputs[i]).abs().max().item()
            scale = outputs[i].abs().max().item()
            assert diffs[i] < 1e-4, f"layer {i}: recurrent vs chunked differ by {diffs[i]} (|out| {scale})"
    return diffs, {i: outputs[i].abs().max().item() for i in outputs}


# ---- the oracle ---------------------------------------------------------------


def top2_margin(logits):
    t = torch.topk(logits.float(), 2, dim=-1).values
    return (t[..., 0] - t[..., 1]).min().item()


def routers(model):
    return [l.mlp.gate for l in text_model(model).layers if hasattr(l.mlp, "experts")]


def evaluate(model, prompt, log_paths=False):
    log = PathLog(modeling_of(model))
    with torch.no_grad(), log:
        out = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
            output_logits=True,
            return_dict_in_generate=True,
        )
    gen_paths = log.summary()
    full = out.sequences[0].tolist()
    gen_margin = min(top2_margin(l[0]) for l in out.logits)
    captured = []
    hooks = [g.register_forward_hook(lambda _m, _i, o: captured.append(o[0].detach())) for g in routers(model)]
    log = PathLog(modeling_of(model))
    with torch.no_grad(), log:
        logits = model(torch.tensor([full]), use_cache=False).logits[0]
    tf_paths = log.summary()
    for h in hooks:
        h.remove()
    k = text_config(model).num_experts_per_tok
    usage, gap = [], float("inf")
    for rl in captured:
        # The gap is taken on the router logits: what decides the top-k is
        # their order, and softmax of peaked logits squeezes every gap to ~0.
        top = torch.topk(rl.float(), k + 1, dim=-1)
        gap = min(gap, (top.values[:, k - 1] - top.values[:, k]).min().item())
        usage.append(len(set(top.indices[:, :k].flatten().tolist())))
    r = dict(
        full_ids=full,
        tf_pred=logits.argmax(-1).tolist(),
        gen_margin=gen_margin,
        tf_margin=top2_margin(logits),
        logit_std=logits.std().item(),
        min_router_gap=gap,
        expert_usage=usage,
        logits_last=logits[-1].tolist(),
        distinct_new=len(set(full[len(prompt) :])),
    )
    r["min_margin"] = min(r["gen_margin"], r["tf_margin"])
    if log_paths:
        r["paths"] = dict(generate=gen_paths, teacher_forced=tf_paths)
    return r


def choose(name, seeds, scales):
    best = None
    n_exp = SHAPES[name]["config"]["num_experts"]
    for scale in scales:
        for seed in seeds:
            model, cls, prompt = build(name, seed, scale)
            r = evaluate(model, prompt)
            ok = (
                r["min_margin"] > 0.01
                and r["min_router_gap"] > 1e-3
                and r["distinct_new"] >= NEW_TOKENS // 2
                and min(r["expert_usage"]) >= n_exp - 1
            )
            g8 = t8 = None
            if ok:
                q = evaluate(int8_copy(model), prompt)
                g8 = sum(a != b for a, b in zip(q["full_ids"], r["full_ids"]))
                t8 = sum(a != b for a, b in zip(q["tf_pred"], r["tf_pred"]))
                ok = q["min_margin"] > 0.01 and q["min_router_gap"] > 1e-3
            print(
                f"  {name} seed={seed} scale={scale}: margin={r['min_margin']:.4f} router_gap={r['min_router_gap']:.5f} "
                f"usage={r['expert_usage']} distinct={r['distinct_new']} int8={g8}/{t8} -> {'ok' if ok else 'no'}",
                flush=True,
            )
            if ok:
                score = min(r["min_margin"], q["min_margin"], 20 * r["min_router_gap"], 20 * q["min_router_gap"])
                if best is None or score > best[0]:
                    best = (score, seed, scale)
    if best is None:
        raise SystemExit(f"{name}: no candidate met the criteria")
    return best[1], best[2]


def verify_reload(model, cls, out_dir, full_ids):
    re = cls.from_pretrained(out_dir, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager")
    re.eval()
    x = torch.tensor([full_ids])
    with torch.no_grad():
        a = model(x, use_cache=False).logits
        b = re(x, use_cache=False).logits
    if not torch.equal(a, b):
        raise SystemExit(f"{out_dir}: reloaded checkpoint differs, max |d| = {(a - b).abs().max().item()}")
    return re


def make(name, seed, scale, out_root):
    model, cls, prompt = build(name, seed, scale)
    d = os.path.join(out_root, name)
    shutil.rmtree(d, ignore_errors=True)
    model.save_pretrained(d)
    src = os.path.join(ROOT, "fixtures", TOKENIZER_FROM)
    for f in COPIED:
        shutil.copy(os.path.join(src, f), d)
    # The oracle is the checkpoint as written, reloaded.
    model = verify_reload(model, cls, d, prompt)
    r = evaluate(model, prompt, log_paths=True)
    q = evaluate(int8_copy(model), prompt, log_paths=True)
    diffs, scales = recurrent_check(model, prompt)
    # prefill: one chunked call per linear layer on the 80-token prompt; decode:
    # one recurrent call (and one conv update) per linear layer per new token.
    n_lin = text_config(model).layer_types.count("linear_attention")
    want = {
        f"torch_chunk_gated_delta_rule(seq={PROMPT_LEN}, chunk_size={CHUNK})": n_lin,
        f"causal_conv1d_fn(seq={PROMPT_LEN})": n_lin,
        "torch_recurrent_gated_delta_rule(seq=1)": n_lin * (NEW_TOKENS - 1),
        "causal_conv1d_update(seq=1)": n_lin * (NEW_TOKENS - 1),
    }
    assert r["paths"]["generate"] == want, r["paths"]["generate"]
    ref = {
        "prompt_ids": prompt,
        "full_ids": r["full_ids"],
        "tf_pred": r["tf_pred"],
        "int8_full_ids": q["full_ids"],
        "int8_tf_pred": q["tf_pred"],
        "dtype": "f32",
        "new_tokens": NEW_TOKENS,
        "min_margin": r["min_margin"],
        "gen_min_margin": r["gen_margin"],
        "tf_min_margin": r["tf_margin"],
        "min_router_gap": r["min_router_gap"],
        "int8_min_margin": q["min_margin"],
        "int8_gen_min_margin": q["gen_margin"],
        "int8_tf_min_margin": q["tf_margin"],
        "int8_min_router_gap": q["min_router_gap"],
        "expert_usage": r["expert_usage"],
        "logits_last": r["logits_last"],
        "int8_logits_last": q["logits_last"],
        "recurrent_vs_chunked_max_abs": {str(k): v for k, v in diffs.items()},
        "generator": {
            "script": "tools/make_qwen3_next_fixtures.py",
            "fixture": name,
            "seed": seed,
            "scale": scale,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "attn_implementation": "eager",
            "experts_implementation": "eager",
            "code_paths": r["paths"],
        },
    }
    with open(os.path.join(d, "REF.json"), "w") as f:
        json.dump(ref, f)
        f.write("\n")
    with safe_open(os.path.join(d, "model.safetensors"), "pt") as f:
        names = list(f.keys())
    print(f"{name}: seed {seed} scale {scale}", flush=True)
    print(f"  margins f32 gen {r['gen_margin']:.4f} tf {r['tf_margin']:.4f}, int8 gen {q['gen_margin']:.4f} tf {q['tf_margin']:.4f}")
    print(f"  router gap {r['min_router_gap']:.5f} int8 {q['min_router_gap']:.5f}, usage {r['expert_usage']}")
    print(f"  int8 tokens equal f32: greedy {q['full_ids'] == r['full_ids']} tf {q['tf_pred'] == r['tf_pred']}")
    print(f"  |f32 - int8 logits_last| max {max(abs(a - b) for a, b in zip(r['logits_last'], q['logits_last'])):.4f}")
    print(f"  recurrent vs chunked, per linear layer: " + ", ".join(f"{k}: {v:.2e} (|out| {scales[k]:.2f})" for k, v in diffs.items()))
    print(f"  code paths: {json.dumps(r['paths'])}")
    print(f"  full_ids {r['full_ids']}")
    print(f"  logits_last {[round(x, 4) for x in r['logits_last']]}")
    print(f"  {len(names)} tensors, {os.path.getsize(os.path.join(d, 'model.safetensors'))} bytes")
    for label, group in (("int8 round trip", [n for n in names if not kept_f32(n)]), ("kept f32", [n for n in names if kept_f32(n)])):
        print(f"  {label}: {len(group)} tensors: {', '.join(patterns(group))}")
    return r


def patterns(names):
    """Names with layer and expert numbers replaced by L and E, deduplicated."""
    out = []
    for n in names:
        parts = n.split(".")
        for i, x in enumerate(parts):
            if x.isdigit():
                parts[i] = "E" if i > 0 and parts[i - 1] == "experts" else "L"
        p = ".".join(parts)
        if p not in out:
            out.append(p)
    return out


PLANS = {
    "qwen3-next-tiny": dict(seeds=range(1, 21), scales=[1.0]),
    "qwen3-5-moe-tiny": dict(seeds=range(1, 21), scales=[1.0]),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "fixtures"))
    ap.add_argument("--only", default=None)
    ap.add_argument("--seed", type=int, default=None, help="skip the search")
    ap.add_argument("--scale", type=float, default=1.0)
    args = ap.parse_args()
    assert transformers.__version__ == "5.23.0", transformers.__version__
    assert_torch_paths()
    for name in SHAPES:
        if args.only and name != args.only:
            continue
        if args.seed is None:
            print(f"{name}: searching", flush=True)
            seed, scale = choose(name, **PLANS[name])
        else:
            seed, scale = args.seed, args.scale
        make(name, seed, scale, os.path.abspath(args.out))


if __name__ == "__main__":
    sys.exit(main())
