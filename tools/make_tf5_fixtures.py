#!/usr/bin/env python3
# Checkpoints as transformers 5 writes them, with transformers 5's own oracle.
#
# For each family whose fixture was made under transformers 4.57 (Qwen3-MoE,
# Mixtral, GLM-4.x, DeepSeek-V3), this loads that fixture with transformers 5
# (which converts it to its in-memory layout), writes it back with
# save_pretrained (transformers 5's config spelling: `num_local_experts`,
# `rope_parameters` with `partial_rotary_factor` inside, `dtype`; and its tensor
# layout on disk), and records REF.json from transformers 5 running the
# reloaded checkpoint: greedy continuation, teacher-forced argmax, and the int8
# round-trip oracle (every matrix the engine quantizes at --expert-bits 8
# --dense-bits 8, per output row: scale = amax/127, round half to even, clamp to
# [-128, 127]; routers, norms and biases stay f32), same format as the other
# fixture scripts (docs/formats.md).
#
# Pinned versions (the numbers in fixtures/tf5/ were produced with exactly these):
#   torch==2.9.1  transformers==5.23.0  safetensors==0.8.0  tokenizers==0.23.x
# Run (CPU only, deterministic), e.g. with transformers 5 installed into a
# directory of its own beside a venv that has torch:
#   PYTHONPATH=/work/bench-data/tf5lib /work/bench-data/peers/venv/bin/python tools/make_tf5_fixtures.py
import argparse
import copy
import json
import os
import shutil

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import torch
import transformers
from transformers import AutoModelForCausalLM

torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")

# fixture under fixtures/tf5/ -> the transformers-4.57 fixture it is made from.
SOURCES = {
    "qwen3-moe": "qwen3-moe-tiny",
    "mixtral": "mixtral-tiny",
    "glm4-moe": "glm4-moe-tiny",
    "deepseek-v3": "deepseek-v3-tiny",
}

COPIED = ["tokenizer.json", "tokenizer_config.json", "generation_config.json"]


def is_router(name):
    return name.endswith("mlp.gate.weight") or name.endswith("block_sparse_moe.gate.weight")


def int8_copy(model):
    q = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in q.named_parameters():
            if p.dim() < 2 or is_router(name):
                continue
            w = p.data.float()
            scale = (w.abs().amax(dim=-1, keepdim=True) / 127.0).clamp(min=1e-8)
            p.data.copy_(torch.round(w / scale).clamp(-128, 127) * scale)
    return q


def run(model, prompt, new_tokens, eos):
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=0,
            output_logits=True,
            return_dict_in_generate=True,
        )
        full = out.sequences[0].tolist()
        logits = model(torch.tensor([full]), use_cache=False).logits[0]
    top = torch.topk(torch.stack([l[0] for l in out.logits]).float(), 2, dim=-1).values
    tf_top = torch.topk(logits.float(), 2, dim=-1).values
    return dict(
        full_ids=full,
        tf_pred=logits.argmax(-1).tolist(),
        gen_min_margin=(top[:, 0] - top[:, 1]).min().item(),
        tf_min_margin=(tf_top[:, 0] - tf_top[:, 1]).min().item(),
        logits_last=logits[-1].tolist(),
    )


def make(name, src_name, out_root):
    src = os.path.join(ROOT, "fixtures", src_name)
    dst = os.path.join(out_root, name)
    old = json.load(open(os.path.join(src, "REF.json")))
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager")
    model.eval()
    if os.path.isdir(dst):
        shutil.rmtree(dst)
    model.save_pretrained(dst)
    for f in COPIED:
        if os.path.exists(os.path.join(src, f)):
            shutil.copy(os.path.join(src, f), dst)
    # The oracle is the checkpoint as written, reloaded.
    model = AutoModelForCausalLM.from_pretrained(dst, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager")
    model.eval()
    prompt = old["prompt_ids"]
    n = old.get("new_tokens", len(old["full_ids"]) - len(prompt))
    # Run exactly n steps whatever token comes (the engine's greedy check
    # compares every position of full_ids).
    r = run(model, prompt, n, None)
    q = run(int8_copy(model), prompt, n, None)
    ref = {
        "prompt_ids": prompt,
        "full_ids": r["full_ids"],
        "tf_pred": r["tf_pred"],
        "int8_full_ids": q["full_ids"],
        "int8_tf_pred": q["tf_pred"],
        "dtype": "f32",
        "new_tokens": n,
        "gen_min_margin": r["gen_min_margin"],
        "tf_min_margin": r["tf_min_margin"],
        "int8_gen_min_margin": q["gen_min_margin"],
        "int8_tf_min_margin": q["tf_min_margin"],
        "logits_last": r["logits_last"],
        "int8_logits_last": q["logits_last"],
        "same_as_transformers_4": r["full_ids"] == old["full_ids"] and r["tf_pred"] == old.get("tf_pred"),
        "generator": {
            "script": "tools/make_tf5_fixtures.py",
            "fixture": name,
            "from": f"fixtures/{src_name}",
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "attn_implementation": "eager",
            "experts_implementation": "eager",
        },
    }
    with open(os.path.join(dst, "REF.json"), "w") as f:
        json.dump(ref, f)
        f.write("\n")
    cfg = json.load(open(os.path.join(dst, "config.json")))
    print(
        f"{name}: same as 4.57: {ref['same_as_transformers_4']}, margins gen {r['gen_min_margin']:.4f} "
        f"tf {r['tf_min_margin']:.4f}, int8 {q['gen_min_margin']:.4f}/{q['tf_min_margin']:.4f}; "
        f"config keys: {sorted(k for k in cfg if 'expert' in k or 'rope' in k or 'dtype' in k)}",
        flush=True,
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "fixtures", "tf5"))
    ap.add_argument("--only", default=None)
    args = ap.parse_args()
    assert transformers.__version__.startswith("5."), transformers.__version__
    os.makedirs(args.out, exist_ok=True)
    for name, src in SOURCES.items():
        if args.only and name != args.only:
            continue
        make(name, src, os.path.abspath(args.out))


if __name__ == "__main__":
    main()
