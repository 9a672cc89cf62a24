#!/usr/bin/env python3
"""Expected RoPE-scaling numbers for src/model/ops.rs's tests.

Pinned: torch 2.x (CPU) with transformers 4.57.x (the peers venv), and
transformers 5.23 (PYTHONPATH=/work/bench-data/tf5lib before the same
python); both must print the same numbers.

    /work/bench-data/peers/venv/bin/python tools/rope_scaling_oracle.py

Prints, per case, transformers' attention factor, inv_freq at a few
indices and cos * attention_factor at long positions, as f32 values the
tests compare against `Rope::scaled`.
"""
import transformers
import torch
from transformers import Qwen3MoeConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

CASES = {
    # Qwen3 run at 128k (Qwen's model card): YaRN 4x over 32768.
    "yarn_qwen3": dict(rope_theta=1e6, max_position_embeddings=40960,
                       rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                     "original_max_position_embeddings": 32768}),
    "linear_2": dict(rope_theta=1e6, max_position_embeddings=32768,
                     rope_scaling={"rope_type": "linear", "factor": 2.0}),
}
IDX = [0, 1, 7, 20, 31, 40, 50, 63]
POS = [40000, 131071]

print("transformers", transformers.__version__, "torch", torch.__version__)
for name, kw in CASES.items():
    kind = kw["rope_scaling"]["rope_type"]
    if transformers.__version__.startswith("5"):
        params = dict(kw["rope_scaling"], rope_theta=kw["rope_theta"])
        cfg = Qwen3MoeConfig(head_dim=128, hidden_size=2048, num_attention_heads=32,
                             max_position_embeddings=kw["max_position_embeddings"],
                             rope_parameters=params)
    else:
        cfg = Qwen3MoeConfig(head_dim=128, hidden_size=2048, num_attention_heads=32, **kw)
    inv, att = ROPE_INIT_FUNCTIONS[kind](cfg, "cpu")
    print(name, "attention_factor", repr(float(att)))
    print(name, "inv_freq", [float(inv[i]) for i in IDX])
    for p in POS:
        freqs = inv.float()[:, None] @ torch.tensor([[float(p)]])
        cos = (freqs.cos() * att)[:, 0]
        print(name, "cos", p, [float(cos[i]) for i in IDX])
