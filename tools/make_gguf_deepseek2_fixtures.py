#!/usr/bin/env python3
# GGUF fixtures of llama.cpp's `deepseek2` architecture (DeepSeek-V2/V3/R1
# shaped MLA models), written by llama.cpp's own converter and quantizer,
# and llama.cpp's outputs on them: fixtures/gguf/families/deepseek2/
# {*.gguf, REF.json}, read by tests/gguf_deepseek2.rs.
#
# Pinned versions (the committed files were produced with exactly these):
#   llama.cpp as vendored by llama-cpp-python 0.3.36 (its converter, and
#     the venv's own libllama: llama_model_quantize through the Python
#     bindings; tools/gguf_ref.c linked against the same library);
#   torch==2.9.1  transformers==4.57.1  safetensors==0.6.2  numpy==2.4.6;
#   gcc 12.2 (any C11 compiler) for tools/gguf_ref.c.
# Usage (CPU only):
#   /work/bench-data/peers/venv/bin/python tools/make_gguf_deepseek2_fixtures.py \
#       LLAMA_CPP_SRC [WORK_DIR]
#
# A random transformers DeepseekV3ForCausalLM (q_lora_rank set, a dense
# first layer, a shared expert, a sigmoid router with a correction bias,
# top-k renormalised and scaled, YaRN scaling with mscale_all_dim) whose
# every matrix row is a multiple of 32 long, chosen by a small seed search
# so that neither transformers nor llama.cpp decides a token or an expert
# by a near-tie. The converter writes it with MLA's split attn_k_b /
# attn_v_b (the current layout); a second file has the joint attn_kv_b of
# older converters, rewritten from the first with gguf-py (the tensor the
# split was made from, the same values). Each is quantized to Q8_0 and
# Q4_0 by llama.cpp, and tools/gguf_ref.c runs on every file (prompt and
# teacher-forcing sequence of fixtures/olmoe-tiny/REF.json, 24 new tokens).
# The F32 file is checked against transformers (cross_checks in REF.json).
# Helpers (weights, converter patches, quantizer, harness) are shared with
# tools/make_gguf_family_fixtures.py.
import json
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_gguf_family_fixtures as fam  # noqa: E402

REPO = os.path.dirname(HERE)
OUT = os.path.join(REPO, "fixtures", "gguf", "families", "deepseek2")
QTYPES = ["Q8_0", "Q4_0"]
SEEDS = range(1, 81)
MIN_ROUTER_GAP = 1e-3
SHORTLIST = 6

DSV3 = dict(
    vocab_size=256, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
    num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
    q_lora_rank=32, kv_lora_rank=64, qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32,
    n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=1,
    n_group=2, topk_group=1, norm_topk_prob=True, routed_scaling_factor=2.5,
    # As DeepSeek-V3's config.json has them (transformers keeps them as
    # extra keys; the converter stores the gating function from the first).
    scoring_func="sigmoid", topk_method="noaux_tc",
    rope_theta=10000.0, max_position_embeddings=512,
    rope_scaling=dict(type="yarn", factor=4.0, original_max_position_embeddings=128,
                      beta_fast=32, beta_slow=1, mscale=1.0, mscale_all_dim=1.0),
    rope_interleave=True, rms_norm_eps=1e-6, tie_word_embeddings=False,
    eos_token_id=0, pad_token_id=1, bos_token_id=None,
)
fam.FAMILIES["deepseek2"] = ("DeepseekV3Config", "DeepseekV3ForCausalLM", DSV3)
fam.ROUTER_SCALE["deepseek2"] = 1.5


def joint_kv_b(llama_cpp, src, dst):
    """The same model with the joint attn_kv_b older converters wrote:
    per head the K rows (attn_k_b transposed back) then the V rows."""
    sys.path.insert(0, os.path.join(llama_cpp, "gguf-py"))
    import numpy as np
    from gguf import GGUFReader, GGUFWriter, GGUFValueType

    r = GGUFReader(src)
    arch = "deepseek2"
    w = GGUFWriter(dst, arch)
    # Older converters wrote the MLA head sizes as the plain key / value
    # lengths (no `_mla` keys, which llama.cpp takes as the joint layout)
    # and every head as a KV head.
    old = {f"{arch}.attention.key_length": f"{arch}.attention.key_length_mla",
           f"{arch}.attention.value_length": f"{arch}.attention.value_length_mla",
           f"{arch}.attention.head_count_kv": f"{arch}.attention.head_count"}
    for field in r.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        if field.name.endswith("_mla"):
            continue
        if field.name in old:
            field = r.fields[old[field.name]]
            w.add_key_value([k for k, v in old.items() if v == field.name][0], field.contents(),
                            field.types[0])
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        w.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
    tensors = {t.name: t for t in r.tensors}
    for t in r.tensors:
        if t.name.endswith("attn_v_b.weight"):
            continue
        if t.name.endswith("attn_k_b.weight"):
            kb = np.array(t.data, dtype=np.float32)  # [heads, kv_lora, nope]
            vb = np.array(tensors[t.name.replace("attn_k_b", "attn_v_b")].data, dtype=np.float32)
            kv = np.concatenate([kb.transpose(0, 2, 1), vb], axis=1)  # [heads, nope + v, kv_lora]
            kv = kv.reshape(-1, kv.shape[-1])
            w.add_tensor(t.name.replace("attn_k_b", "attn_kv_b"), np.ascontiguousarray(kv))
        else:
            w.add_tensor(t.name, np.array(t.data, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: make_gguf_deepseek2_fixtures.py LLAMA_CPP_SRC [WORK_DIR]")
    llama_cpp = os.path.abspath(sys.argv[1])
    import llama_cpp as bindings

    fam.SEEDS["deepseek2"] = SEEDS
    fam.MIN_ROUTER_GAP["deepseek2"] = MIN_ROUTER_GAP
    fam.SHORTLIST = SHORTLIST
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

    family = "deepseek2"
    print(f"{family}: searching", flush=True)
    # The search's result is kept in WORK_DIR, so a rerun there skips it.
    cache = os.path.join(work, "search.json")
    f32 = os.path.join(work, f"{family}-f32.gguf")
    if os.path.exists(cache) and os.path.exists(f32):
        hf = json.load(open(cache))
    else:
        hf, f32 = fam.search(family, llama_cpp, exe, work, prompt, seq)
        json.dump(hf, open(cache, "w"))
    joint = os.path.join(work, "joint-f32.gguf")
    joint_kv_b(llama_cpp, f32, joint)
    paths = {}
    for layout, src in (("", f32), ("-kvb", joint)):
        stem = f"{family}-tiny{layout}"
        paths[f"{stem}-f32.gguf"] = src
        for q in QTYPES:
            dst = os.path.join(OUT, f"{stem}-{q.lower()}.gguf")
            fam.quantize(src, dst, q)
            paths[f"{stem}-{q.lower()}.gguf"] = dst
    for name in list(paths):
        if name.endswith("-f32.gguf"):
            dst = os.path.join(OUT, name)
            shutil.copy(paths[name], dst)
            paths[name] = dst
    files, settings = {}, None
    for name, path in paths.items():
        out = fam.run_harness(exe, path, prompt, seq)
        files[name] = dict(
            family=family, size=os.path.getsize(path), model_desc=out["model_desc"],
            tensor_types=fam.tensor_types(llama_cpp, path), greedy=out["greedy"],
            greedy_margin=out["greedy_margin"], tf_argmax=out["tf_argmax"], tf_margin=out["tf_margin"],
            tf_router_gap=out["tf_router_gap"], min_router_gap_greedy=out["min_router_gap_greedy"],
            logits_first=out["logits_first"], logits_last=out["logits_last"],
            tf_seq_argmax=out["tf_seq_argmax"], tf_seq_margin=out["tf_seq_margin"],
            logits_last_seq=out["logits_last_seq"],
        )
        settings = out["settings"]
        print(f"{name}: {files[name]['size']} bytes, min margin greedy "
              f"{min(out['greedy_margin']):.4f} tf_seq {min(out['tf_seq_margin']):.4f}", flush=True)
    f32_out = files[f"{family}-tiny-f32.gguf"]
    checks = {f"{family}-tiny-f32.gguf": dict(
        oracle="transformers 4.57.1 DeepseekV3ForCausalLM on the same checkpoint (f32, eager)",
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
            script="tools/make_gguf_deepseek2_fixtures.py", harness="tools/gguf_ref.c",
            llama_cpp="vendored by llama-cpp-python 0.3.36",
            libllama=os.path.basename(os.path.realpath(os.path.join(lib_dir, "libllama.so"))),
            torch=torch.__version__, transformers=transformers.__version__,
            safetensors=safetensors.__version__, numpy=numpy.__version__,
            compile=" ".join(a.replace(llama_cpp, "$LLAMA_CPP_SRC").replace(lib_dir, "$LLAMA_LIB")
                             .replace(work, "$WORK").replace(REPO + "/", "") for a in gcc_cmd),
            settings=settings,
        ),
        prompt_ids=prompt, full_ids=seq, new_tokens=fam.NEW_TOKENS,
        files=files,
        families={family: dict(config=DSV3, seed=hf["seed"], hf_greedy=hf["greedy"], hf_tf_pred=hf["tf_pred"],
                               hf_min_router_gap=hf["min_router_gap"], llama_scores=hf["llama_scores"],
                               score=hf["score"])},
        cross_checks=checks,
    )
    with open(os.path.join(OUT, "REF.json"), "w") as f:
        json.dump(ref, f)
        f.write("\n")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
