#!/usr/bin/env python3
# Oracle fixtures for the OLMoE engine: tiny random-weight OlmoeForCausalLM checkpoints
# plus a transformers-produced REF.json (docs/formats.md) for each.
#
# Pinned versions (the numbers in fixtures/ were produced with exactly these):
#   torch==2.15.0  transformers==5.23.0  safetensors==0.8.0  numpy==2.4.6  tokenizers==0.23.3
# Run (CPU only, deterministic):
#   /work/.venv-oracle/bin/python tools/make_olmoe_fixtures.py [--out fixtures]
#
# Every fixture directory holds config.json, model.safetensors (F32, per-expert tensor
# names model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight as in the published
# OLMoE checkpoints), generation_config.json and REF.json. The checkpoint is written by
# this script (not by save_pretrained) so the split of transformers' fused
# experts.gate_up_proj [E, 2*I, H] is explicit: rows [0, I) are gate_proj, rows [I, 2I)
# are up_proj (OlmoeExperts.forward does `.chunk(2, dim=-1)` -> gate, up; the loader's
# conversion mapping concatenates gate then up). Each written checkpoint is reloaded with
# from_pretrained and its logits compared bit-for-bit with the in-memory model.
#
# Random weights at the default init (std 0.02) give near-uniform logits, so greedy
# decoding would hinge on near-ties. Weights are therefore drawn with larger, fan-in
# scaled deviations, norm weights are randomised around 1 (so an engine that ignores a
# norm weight fails), and a small search over seeds keeps the first candidate whose
# smallest top1-top2 logit margin (greedy steps and teacher-forced positions) and
# smallest router top-k logit gap are comfortably large.
import argparse
import copy
import json
import os
import shutil
import sys

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import numpy as np
import torch
from safetensors.torch import save_file
from transformers import OlmoeConfig, OlmoeForCausalLM

torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)

NEW_TOKENS = 24

SHAPES = {
    # (a) plain MHA, unnormalised top-k, separate lm_head
    "olmoe-tiny": dict(
        config=dict(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=32,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=4,
            num_experts=8,
            num_experts_per_tok=2,
            norm_topk_prob=False,
            tie_word_embeddings=False,
            clip_qkv=None,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            max_position_embeddings=512,
            eos_token_id=0,
            pad_token_id=1,
            bos_token_id=None,
        ),
        prompt_len=10,
    ),
    # (b) odd sizes: head_dim 12, GQA 6/2, odd intermediate, odd vocab, 6 experts top-3,
    # normalised top-k, clip_qkv active, rope_theta 5e5, tied embeddings.
    "olmoe-odd": dict(
        config=dict(
            vocab_size=301,
            hidden_size=72,
            intermediate_size=37,
            num_hidden_layers=3,
            num_attention_heads=6,
            num_key_value_heads=2,
            num_experts=6,
            num_experts_per_tok=3,
            norm_topk_prob=True,
            tie_word_embeddings=True,
            clip_qkv=None,  # set per candidate so that clipping really happens
            rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
            max_position_embeddings=512,
            eos_token_id=300,
            pad_token_id=299,
            bos_token_id=None,
        ),
        prompt_len=13,
    ),
}


def init_weights(model, gen, scale):
    """Re-draw every parameter with decisive (non-default) scales."""
    cfg = model.config
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.copy_(1.0 + 0.25 * torch.randn(p.shape, generator=gen))
            elif name == "model.embed_tokens.weight":
                p.copy_(torch.randn(p.shape, generator=gen))
            elif name == "lm_head.weight":
                p.copy_(torch.randn(p.shape, generator=gen) * (6.0 / cfg.hidden_size**0.5))
            elif name.endswith("mlp.gate.weight"):
                # router: large enough that top-k differs from token to token
                p.copy_(torch.randn(p.shape, generator=gen) * (6.0 / cfg.hidden_size**0.5))
            elif name.endswith("experts.gate_up_proj"):
                p.copy_(torch.randn(p.shape, generator=gen) * (scale / cfg.hidden_size**0.5))
            elif name.endswith("experts.down_proj"):
                p.copy_(torch.randn(p.shape, generator=gen) * (scale / cfg.intermediate_size**0.5))
            elif p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=gen) * (scale / p.shape[1] ** 0.5))
            else:
                raise RuntimeError(f"unexpected parameter {name}")
    if cfg.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def top2_margin(logits):
    t = torch.topk(logits.float(), 2, dim=-1).values
    return (t[..., 0] - t[..., 1]).min().item()


class ClipCounter:
    """Counts how many q/k/v elements clip_qkv actually clips (reimplements the
    pre-clip values via hooks on the projections and norms)."""

    def __init__(self, model):
        self.clipped = 0
        self.total = 0
        self.handles = []
        clip = model.config.clip_qkv
        if clip is None:
            return
        for layer in model.model.layers:
            att = layer.self_attn
            for mod in (att.q_norm, att.k_norm, att.v_proj):
                self.handles.append(mod.register_forward_hook(self._hook(clip)))

    def _hook(self, clip):
        def f(_m, _i, out):
            self.clipped += int((out.abs() > clip).sum())
            self.total += out.numel()

        return f

    def close(self):
        for h in self.handles:
            h.remove()


def evaluate(model, prompt_ids):
    cfg = model.config
    inp = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = model.generate(
            inp,
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            eos_token_id=cfg.eos_token_id,
            pad_token_id=cfg.pad_token_id,
            output_logits=True,
            return_dict_in_generate=True,
        )
    full = out.sequences[0].tolist()
    gen_margin = min(top2_margin(l[0]) for l in out.logits)
    full_t = torch.tensor([full])
    counter = ClipCounter(model)
    with torch.no_grad():
        fw = model(full_t, output_router_logits=True, use_cache=False)
    counter.close()
    logits = fw.logits[0]
    tf_pred = logits.argmax(-1).tolist()
    tf_margin = top2_margin(logits)
    usage, router_gap = [], float("inf")
    k = cfg.num_experts_per_tok
    for rl in fw.router_logits:
        # softmax is monotone: the expert choice hinges on the router *logit* gap
        top = torch.topk(rl.float(), k + 1, dim=-1)
        router_gap = min(router_gap, (top.values[:, k - 1] - top.values[:, k]).min().item())
        usage.append(len(set(top.indices[:, :k].flatten().tolist())))
    return dict(
        full_ids=full,
        tf_pred=tf_pred,
        gen_margin=gen_margin,
        tf_margin=tf_margin,
        min_margin=min(gen_margin, tf_margin),
        logit_std=logits.std().item(),
        min_router_gap=router_gap,
        expert_usage=usage,
        logits_last=logits[-1].tolist(),
        clip_fraction=(counter.clipped / counter.total) if counter.total else 0.0,
        complete=len(full) == len(prompt_ids) + NEW_TOKENS,
        distinct_new=len(set(full[len(prompt_ids) :])),
    )


def per_expert_state_dict(model):
    """The checkpoint tensors with the published per-expert OLMoE names."""
    cfg = model.config
    inter = cfg.intermediate_size
    out = {}
    for name, t in model.state_dict().items():
        t = t.detach().to(torch.float32).contiguous()
        if name.endswith("mlp.experts.gate_up_proj"):
            base = name[: -len("gate_up_proj")]
            assert t.shape == (cfg.num_experts, 2 * inter, cfg.hidden_size)
            for e in range(cfg.num_experts):
                out[f"{base}{e}.gate_proj.weight"] = t[e, :inter].clone().contiguous()
                out[f"{base}{e}.up_proj.weight"] = t[e, inter:].clone().contiguous()
        elif name.endswith("mlp.experts.down_proj"):
            base = name[: -len("down_proj")]
            assert t.shape == (cfg.num_experts, cfg.hidden_size, inter)
            for e in range(cfg.num_experts):
                out[f"{base}{e}.down_proj.weight"] = t[e].clone().contiguous()
        elif name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue  # tied: published checkpoints omit it
        else:
            out[name] = t.clone()
    return out


def write_checkpoint(model, tensors, out_dir, shards=1):
    os.makedirs(out_dir, exist_ok=True)
    model.config.architectures = ["OlmoeForCausalLM"]
    model.config.save_pretrained(out_dir)
    model.generation_config.save_pretrained(out_dir)
    meta = {"format": "pt"}
    if shards == 1:
        save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata=meta)
        return
    names = sorted(tensors)
    per = (len(names) + shards - 1) // shards
    weight_map, total = {}, 0
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[s * per : (s + 1) * per]}
        save_file(part, os.path.join(out_dir, fname), metadata=meta)
        for n, t in part.items():
            weight_map[n] = fname
            total += t.numel() * t.element_size()
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
        f.write("\n")


def verify_reload(model, out_dir, full_ids):
    re = OlmoeForCausalLM.from_pretrained(
        out_dir, attn_implementation="eager", experts_implementation="eager", dtype=torch.float32
    )
    re.eval()
    x = torch.tensor([full_ids])
    with torch.no_grad():
        a = model(x, use_cache=False).logits
        b = re(x, use_cache=False).logits
    if not torch.equal(a, b):
        raise SystemExit(f"{out_dir}: reloaded checkpoint differs, max |d| = {(a - b).abs().max().item()}")


def build_candidate(name, seed, scale, clip):
    spec = SHAPES[name]
    kw = dict(spec["config"])
    if clip is not None:
        kw["clip_qkv"] = clip
    cfg = OlmoeConfig(**kw)
    cfg._attn_implementation = "eager"
    # the plain per-expert loop (the default grouped_mm path needs 16-byte aligned strides)
    cfg._experts_implementation = "eager"
    torch.manual_seed(seed)
    model = OlmoeForCausalLM(cfg)
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    init_weights(model, gen, scale)
    model.generation_config.eos_token_id = cfg.eos_token_id
    model.generation_config.pad_token_id = cfg.pad_token_id
    model.generation_config.do_sample = False
    pgen = np.random.default_rng(seed)
    # keep special ids (eos/pad) out of the prompt
    specials = {cfg.eos_token_id, cfg.pad_token_id}
    ids = [int(i) for i in pgen.integers(2, cfg.vocab_size, size=4 * spec["prompt_len"])]
    prompt = [i for i in ids if i not in specials][: spec["prompt_len"]]
    return model, prompt


def int8_copy(model):
    """The model with every matrix the engine quantizes at --expert-bits 8
    --dense-bits 8 replaced by its int8 round trip (per-row amax/127 scale,
    round half to even, docs/formats.md). Router and norms stay f32."""
    q = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in q.named_parameters():
            if p.dim() < 2 or name.endswith("mlp.gate.weight"):
                continue
            w = p.data.float()
            amax = w.abs().amax(dim=-1, keepdim=True)
            scale = (amax / 127.0).clamp(min=1e-8)
            p.data.copy_(torch.round(w / scale).clamp(-128, 127) * scale)
    return q


def int8_mismatches(model, prompt_ids, r):
    """Position-wise greedy and teacher-forcing mismatches of the int8 round
    trip against the f32 oracle: a fixture must stay decisive under int8."""
    qr = evaluate(int8_copy(model), prompt_ids)
    n = len(prompt_ids)
    greedy = sum(a != b for a, b in zip(qr["full_ids"][n:], r["full_ids"][n:]))
    with torch.no_grad():
        logits = int8_copy(model)(torch.tensor([r["full_ids"]]), use_cache=False).logits[0]
    tf = sum(a != b for a, b in zip(logits.argmax(-1).tolist(), r["tf_pred"]))
    return greedy, tf


def choose(name, seeds, scales, clips):
    best = None
    for clip in clips:
        for scale in scales:
            for seed in seeds:
                model, prompt = build_candidate(name, seed, scale, clip)
                r = evaluate(model, prompt)
                ok = (
                    r["complete"]
                    and r["min_margin"] > 0.05
                    and r["min_margin"] > 0.01 * r["logit_std"]
                    and r["min_router_gap"] > 2e-3
                    and r["distinct_new"] >= NEW_TOKENS // 2  # no degenerate repeat loop
                    and min(r["expert_usage"]) >= model.config.num_experts - 1
                    and (clip is None or r["clip_fraction"] > 0.02)
                )
                if ok:
                    r["int8_greedy_mismatches"], r["int8_tf_mismatches"] = int8_mismatches(model, prompt, r)
                    ok = r["int8_greedy_mismatches"] <= 1 and r["int8_tf_mismatches"] <= 1
                print(
                    f"  {name} seed={seed} scale={scale} clip={clip}: min_margin={r['min_margin']:.4f} "
                    f"(gen {r['gen_margin']:.4f}, tf {r['tf_margin']:.4f}, logit std {r['logit_std']:.2f}) "
                    f"router_gap={r['min_router_gap']:.5f} usage={r['expert_usage']} "
                    f"clip_frac={r['clip_fraction']:.3f} distinct={r['distinct_new']} complete={r['complete']} "
                    f"int8={r.get('int8_greedy_mismatches')}/{r.get('int8_tf_mismatches')} -> {'ok' if ok else 'no'}",
                    flush=True,
                )
                score = min(r["min_margin"], r["min_router_gap"] * 5) - r.get("int8_greedy_mismatches", 0) - r.get("int8_tf_mismatches", 0)
                if ok and (best is None or score > best[0]):
                    best = (score, seed, scale, clip, model, prompt, r)
    if best is None:
        raise SystemExit(f"{name}: no candidate met the margin criteria")
    return best[1:]


def write_ref(out_dir, name, seed, scale, clip, prompt, r, sharded_of=None):
    ref = {
        "prompt_ids": prompt,
        "full_ids": r["full_ids"],
        "tf_pred": r["tf_pred"],
        "dtype": "f32",
        "new_tokens": NEW_TOKENS,
        "min_margin": r["min_margin"],
        "gen_min_margin": r["gen_margin"],
        "tf_min_margin": r["tf_margin"],
        "min_router_gap": r["min_router_gap"],
        "expert_usage": r["expert_usage"],
        "int8_greedy_mismatches": r.get("int8_greedy_mismatches"),
        "int8_tf_mismatches": r.get("int8_tf_mismatches"),
        "clip_fraction": r["clip_fraction"],
        "logits_last": r["logits_last"],
        "generator": {
            "script": "tools/make_olmoe_fixtures.py",
            "fixture": name,
            "seed": seed,
            "scale": scale,
            "clip_qkv": clip,
            "torch": torch.__version__,
            "transformers": __import__("transformers").__version__,
            "attn_implementation": "eager",
            "experts_implementation": "eager",
        },
    }
    if sharded_of:
        ref["generator"]["copy_of"] = sharded_of
    with open(os.path.join(out_dir, "REF.json"), "w") as f:
        json.dump(ref, f)
        f.write("\n")


TOKENIZER_TEXT = """
The small engine reads its weights from disk one expert at a time.
Hello world! This is a tiny tokenizer for a tiny random model.
A mixture of experts routes every token to a few experts out of many.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 2024. Punctuation: , . ; : ! ? ( ) [ ] { } " ' - + = / * < > _ #
The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.
hello there, how are you today? I am fine, thank you. What is the weather like?
"""


def write_tiny_tokenizer(out_dir, vocab_size):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|pad|>", "<unk>"],
        show_progress=False,
    )
    tok.train_from_iterator([TOKENIZER_TEXT] * 4, trainer=trainer)
    assert tok.get_vocab_size() <= vocab_size
    assert tok.token_to_id("<|endoftext|>") == 0 and tok.token_to_id("<|pad|>") == 1
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    tc = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|endoftext|>",
        "pad_token": "<|pad|>",
        "unk_token": "<unk>",
        "bos_token": None,
        "add_bos_token": False,
        "model_max_length": 512,
        "chat_template": (
            "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
        ),
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(tc, f, indent=2)
        f.write("\n")
    enc = tok.encode("Hello world")
    print(f"  tokenizer: vocab {tok.get_vocab_size()}, 'Hello world' -> {enc.ids}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "fixtures"))
    args = ap.parse_args()
    out = os.path.abspath(args.out)
    summary = {}

    plans = {
        "olmoe-tiny": dict(seeds=range(1, 33), scales=[0.75, 1.0, 1.5], clips=[None]),
        "olmoe-odd": dict(seeds=range(1, 33), scales=[0.75, 1.0, 1.5], clips=[1.0, 2.0]),
    }
    for name, plan in plans.items():
        print(f"{name}: searching", flush=True)
        seed, scale, clip, model, prompt, r = choose(name, **plan)
        d = os.path.join(out, name)
        shutil.rmtree(d, ignore_errors=True)
        tensors = per_expert_state_dict(model)
        write_checkpoint(model, tensors, d)
        verify_reload(model, d, r["full_ids"])
        write_ref(d, name, seed, scale, clip, prompt, r)
        if name == "olmoe-tiny":
            write_tiny_tokenizer(d, model.config.vocab_size)
            ds = os.path.join(out, "olmoe-tiny-sharded")
            shutil.rmtree(ds, ignore_errors=True)
            write_checkpoint(model, tensors, ds, shards=2)
            verify_reload(model, ds, r["full_ids"])
            write_ref(ds, "olmoe-tiny-sharded", seed, scale, clip, prompt, r, sharded_of=name)
        summary[name] = dict(
            seed=seed,
            scale=scale,
            clip_qkv=clip,
            min_margin=round(r["min_margin"], 4),
            min_router_gap=round(r["min_router_gap"], 5),
            expert_usage=r["expert_usage"],
            clip_fraction=round(r["clip_fraction"], 4),
            greedy_consistent=r["full_ids"][len(prompt) :] == r["tf_pred"][len(prompt) - 1 : -1],
        )
        print(f"{name}: chose {summary[name]}", flush=True)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    sys.exit(main())
