#!/usr/bin/env python3
# Trains the bundled default model `models/colibri-tiny/`: a small OLMoE-architecture
# chat model (transformers OlmoeForCausalLM) that explains English words.
#
# Pinned versions (the committed model was produced with exactly these):
#   torch==2.15.0  transformers==5.23.0  safetensors==0.8.0  numpy==2.4.6  tokenizers==0.23.3
# Corpus: WordNet 3.0 as shipped by the Debian package `wordnet-base` (1:3.0-37),
#   /usr/share/wordnet/{index,data}.{noun,verb,adj,adv}. Licence: the WordNet 3.0 licence
#   (Princeton University; permission to use, copy, modify and distribute for any purpose
#   without fee, keeping the copyright notice) -- see /usr/share/doc/wordnet-base/copyright.
#   `apt-get install wordnet-base` before running.
# Run (CPU, one thread, deterministic):
#   /work/.venv-oracle/bin/python tools/train_tiny_moe.py [--steps N] [--out models/colibri-tiny]
#
# Dialogues are built from WordNet glosses ("What does X mean?" -> definition and example,
# "Give me a synonym for X" -> synonym), plus a few hand-written greetings; they are packed
# into 128-token windows and trained with next-token loss and OLMoE's router load-balancing
# loss. Output: config.json, model.safetensors (BF16, published per-expert tensor names),
# generation_config.json, tokenizer.json, tokenizer_config.json (chat template, eos),
# REF.json (greedy oracle computed in float32 from the saved BF16 weights), TRAINING.json.
import argparse
import json
import math
import os
import random
import shutil
import sys
import time

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import OlmoeConfig, OlmoeForCausalLM

torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)

WN = "/usr/share/wordnet"
POS = {"noun": "noun", "verb": "verb", "adj": "adjective", "adv": "adverb"}
SPECIALS = ["<|endoftext|>", "<|pad|>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"]
CHAT_TEMPLATE = (
    # Tools render in hermes form (<tool_call>{json}</tool_call>); without
    # tools or calls the prompt is the one the model was trained on.
    "{% if tools %}<|system|>\nTools you may call:\n"
    "{% for t in tools %}{{ t | tojson }}\n"
    "{% endfor %}To call a tool, reply with <tool_call>{\"name\": NAME, \"arguments\": {ARGUMENTS}}</tool_call>.\n"
    "{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'user' %}<|user|>\n{{ m['content'] }}\n"
    "{% elif m['role'] == 'assistant' %}<|assistant|>\n{{ m['content'] if m['content'] is not none else '' }}"
    "{% for c in m['tool_calls'] or [] %}<tool_call>{\"name\": {{ c['function']['name'] | tojson }}, \"arguments\": "
    "{% if c['function']['arguments'] is string %}{{ c['function']['arguments'] }}{% else %}{{ c['function']['arguments'] | tojson }}"
    "{% endif %}}</tool_call>"
    "{% endfor %}<|end|>\n"
    "{% elif m['role'] == 'tool' %}<|user|>\n<tool_response>{{ m['content'] }}</tool_response>\n"
    "{% elif m['role'] == 'system' %}<|system|>\n{{ m['content'] }}\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n"
    "{% endif %}"
)
SEQ = 128

GREETINGS = [
    ("Hello!", "Hello! I am Colibri, a tiny model. Ask me what an English word means."),
    ("Hi", "Hi! I know a little about English words. Which word should I explain?"),
    ("Who are you?", "I am Colibri, a very small mixture-of-experts model trained on WordNet."),
    ("What can you do?", "I can explain English words and give synonyms. Try: what does river mean?"),
    ("Thank you!", "You are welcome!"),
    ("Thanks", "You are welcome! Ask me about another word."),
    ("Goodbye", "Goodbye! Have a nice day."),
    ("How are you?", "I am fine, thank you. Which word would you like to know about?"),
]


def render(messages):
    out = []
    for role, content in messages:
        if role == "user":
            out.append(f"<|user|>\n{content}\n")
        else:
            out.append(f"<|assistant|>\n{content}<|end|>\n")
    return "".join(out)


def load_wordnet():
    """(word, pos, definition, examples, synonyms) for the most frequent sense of each
    lemma that occurs in the sense-tagged corpora (tagsense_cnt > 0)."""
    entries = []
    for pos in POS:
        data = {}
        with open(os.path.join(WN, f"data.{pos}"), encoding="utf-8") as f:
            for line in f:
                if line.startswith("  "):
                    continue
                head, _, gloss = line.partition(" | ")
                parts = head.split()
                n = int(parts[3], 16)
                words = [parts[4 + 2 * i] for i in range(n)]
                data[parts[0]] = (words, gloss.strip())
        with open(os.path.join(WN, f"index.{pos}"), encoding="utf-8") as f:
            for line in f:
                if line.startswith("  "):
                    continue
                parts = line.split()
                lemma, p_cnt = parts[0], int(parts[3])
                tagged = int(parts[5 + p_cnt])
                first = parts[6 + p_cnt]
                if tagged == 0 or "_" in lemma or not lemma.isalpha() or first not in data:
                    continue
                words, gloss = data[first]
                segs = [s.strip() for s in gloss.split(";")]
                definition = segs[0]
                examples = [s.strip('"') for s in segs[1:] if s.startswith('"') and s.endswith('"')]
                syns = [
                    w.split("(")[0].replace("_", " ")
                    for w in words
                    if w.split("(")[0].lower() != lemma and "_" not in w
                ]
                if definition:
                    entries.append((lemma, POS[pos], definition, examples, syns))
    entries.sort()
    return entries


def qa(entry, rng):
    word, pos, definition, examples, syns = entry
    art = "an" if word[0] in "aeiou" else "a"
    r = rng.random()
    if syns and r < 0.15:
        q = rng.choice([f"Give me a synonym for {word}.", f"What is another word for {word}?"])
        a = f"Another word for {word} is {syns[0]}."
        return q, a
    q = rng.choice(
        [
            f"What does {word} mean?",
            f"What does the word {word} mean?",
            f"Define {word}.",
            f"What is the meaning of {word}?",
            f"Explain the word {word}.",
        ]
        + ([f"What is {art} {word}?"] if pos == "noun" else [])
    )
    pos_phrase = {"noun": "a noun", "verb": "a verb", "adjective": "an adjective", "adverb": "an adverb"}[pos]
    a = f'"{word.capitalize()}" is {pos_phrase}. It means {definition}.'
    if examples:
        a += f' For example: "{examples[0]}".'
    return q, a


def build_dialogues(entries, seed, n_dialogues):
    rng = random.Random(seed)
    out = []
    for _ in range(n_dialogues):
        msgs = []
        if rng.random() < 0.08:
            q, a = rng.choice(GREETINGS)
            msgs += [("user", q), ("assistant", a)]
        for _ in range(rng.choice([1, 1, 2, 3])):
            q, a = qa(rng.choice(entries), rng)
            msgs += [("user", q), ("assistant", a)]
        if rng.random() < 0.03:
            q, a = rng.choice(GREETINGS[4:])
            msgs += [("user", q), ("assistant", a)]
        out.append(render(msgs))
    return out


def train_tokenizer(texts, vocab_size):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def model_config(vocab, tok, experts=8, top_k=2):
    return OlmoeConfig(
        vocab_size=vocab,
        hidden_size=128,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        num_experts=experts,
        num_experts_per_tok=top_k,
        norm_topk_prob=False,
        tie_word_embeddings=False,
        clip_qkv=None,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        max_position_embeddings=1024,
        rms_norm_eps=1e-5,
        initializer_range=0.02,
        router_aux_loss_coef=0.01,
        eos_token_id=[tok.token_to_id("<|end|>"), tok.token_to_id("<|endoftext|>")],
        pad_token_id=tok.token_to_id("<|pad|>"),
        bos_token_id=None,
    )


def per_expert_state_dict(model, dtype):
    cfg = model.config
    inter = cfg.intermediate_size
    out = {}
    for name, t in model.state_dict().items():
        t = t.detach().to(dtype).contiguous()
        if name.endswith("mlp.experts.gate_up_proj"):
            base = name[: -len("gate_up_proj")]
            for e in range(cfg.num_experts):
                out[f"{base}{e}.gate_proj.weight"] = t[e, :inter].clone().contiguous()
                out[f"{base}{e}.up_proj.weight"] = t[e, inter:].clone().contiguous()
        elif name.endswith("mlp.experts.down_proj"):
            base = name[: -len("down_proj")]
            for e in range(cfg.num_experts):
                out[f"{base}{e}.down_proj.weight"] = t[e].clone().contiguous()
        elif name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        elif name.endswith("norm.weight") or "layernorm" in name or name.endswith("mlp.gate.weight"):
            out[name] = t.to(torch.float32).clone()  # norms and router stay F32, as docs/formats.md says
        else:
            out[name] = t.clone()
    return out


def write_licence(out):
    """The WordNet licence asks for its notice on all copies: keep it beside the weights."""
    lines, on = [], False
    with open("/usr/share/doc/wordnet-base/copyright", encoding="utf-8") as f:
        for line in f:
            if line.startswith("License: WordNet3.0"):
                on = True
                continue
            if on and not line.strip():
                break
            if on:
                t = line[1:] if line.startswith(" ") else line
                lines.append("\n" if t.strip() == "." else t)
    with open(os.path.join(out, "LICENSE-WordNet.txt"), "w", encoding="utf-8") as f:
        f.write("The training data of this model was derived from WordNet 3.0 "
                "(Debian package wordnet-base 1:3.0-37).\n")
        f.write("WordNet licence, reproduced as its terms require:\n\n")
        f.writelines(lines)


def top2_margin(logits):
    t = torch.topk(logits.float(), 2, dim=-1).values
    return (t[..., 0] - t[..., 1]).min().item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "models", "colibri-tiny"))
    ap.add_argument("--steps", type=int, default=1800)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--experts-impl", default="grouped_mm")
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    args = ap.parse_args()
    out = os.path.abspath(args.out)
    t0 = time.time()
    random.seed(args.seed)
    torch.manual_seed(args.seed)

    entries = load_wordnet()
    print(f"wordnet entries: {len(entries)}", flush=True)
    tok_texts = build_dialogues(entries, args.seed + 1, 20000)
    tok = train_tokenizer(tok_texts, args.vocab)
    vocab = tok.get_vocab_size()
    print(f"tokenizer vocab {vocab}", flush=True)

    # token stream: enough dialogues for every step to see fresh text
    need = args.steps * args.batch * SEQ
    stream, dialogues, eot = [], 0, tok.token_to_id("<|endoftext|>")
    rng_seed = args.seed + 2
    while len(stream) < need + SEQ + 1:
        for text in build_dialogues(entries, rng_seed, 5000):
            stream.extend(tok.encode(text).ids)
            stream.append(eot)
            dialogues += 1
        rng_seed += 1
    data = torch.tensor(stream, dtype=torch.long)
    print(f"{dialogues} dialogues, {len(stream)} tokens ({time.time() - t0:.0f}s)", flush=True)

    cfg = model_config(vocab, tok, args.experts, args.top_k)
    cfg._attn_implementation = "sdpa"
    cfg._experts_implementation = args.experts_impl
    model = OlmoeForCausalLM(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"params {n_params}", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    warm = max(1, args.steps // 20)

    def lr_at(s):
        if s < warm:
            return args.lr * (s + 1) / warm
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (s - warm) / (args.steps - warm))))

    curve = []
    model.train()
    pos = 0
    ema = None
    for step in range(args.steps):
        xb = torch.stack([data[pos + i * SEQ : pos + i * SEQ + SEQ + 1] for i in range(args.batch)])
        pos += args.batch * SEQ
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        o = model(input_ids=xb[:, :-1], labels=xb[:, :-1].clone(), output_router_logits=True, use_cache=False)
        # transformers shifts labels internally; o.loss includes aux loss when router logits on
        lm = o.loss - cfg.router_aux_loss_coef * o.aux_loss
        opt.zero_grad(set_to_none=True)
        o.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ema = lm.item() if ema is None else 0.98 * ema + 0.02 * lm.item()
        if step % 50 == 0 or step == args.steps - 1:
            curve.append(dict(step=step, loss=round(lm.item(), 4), ema=round(ema, 4), aux=round(o.aux_loss.item(), 4)))
            print(f"step {step} loss {lm.item():.4f} ema {ema:.4f} aux {o.aux_loss.item():.4f} "
                  f"lr {lr_at(step):.2e} ({time.time() - t0:.0f}s)", flush=True)
    train_s = time.time() - t0

    # held-out loss on fresh dialogues
    model.eval()
    held = []
    for text in build_dialogues(entries, 999_999, 400):
        held.extend(tok.encode(text).ids + [eot])
    held = torch.tensor(held[: (len(held) // SEQ) * SEQ]).view(-1, SEQ)
    with torch.no_grad():
        held_loss = model(input_ids=held, labels=held, use_cache=False).loss.item()
    print(f"held-out loss {held_loss:.4f}", flush=True)

    # ---- save (BF16 matrices, F32 norms/router) ----
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    tensors = per_expert_state_dict(model, torch.bfloat16)
    save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    cfg.architectures = ["OlmoeForCausalLM"]
    cfg.save_pretrained(out)
    model.generation_config.eos_token_id = cfg.eos_token_id
    model.generation_config.pad_token_id = cfg.pad_token_id
    model.generation_config.do_sample = True
    model.generation_config.temperature = 0.7
    model.generation_config.top_p = 0.9
    model.generation_config.max_new_tokens = 96
    model.generation_config.save_pretrained(out)
    tok.save(os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(
            dict(
                tokenizer_class="PreTrainedTokenizerFast",
                bos_token=None,
                eos_token="<|end|>",
                pad_token="<|pad|>",
                unk_token=None,
                add_bos_token=False,
                model_max_length=1024,
                additional_special_tokens=["<|endoftext|>", "<|user|>", "<|assistant|>", "<|system|>"],
                chat_template=CHAT_TEMPLATE,
            ),
            f,
            indent=2,
        )
        f.write("\n")

    write_licence(out)

    # ---- oracle from the saved checkpoint (BF16 weights upcast, f32 math) ----
    ref_model = OlmoeForCausalLM.from_pretrained(
        out, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager"
    )
    ref_model.eval()
    prompt_text = render([("user", "What does river mean?")]) + "<|assistant|>\n"
    prompt = tok.encode(prompt_text).ids
    with torch.no_grad():
        g = ref_model.generate(
            torch.tensor([prompt]), max_new_tokens=48, do_sample=False,
            eos_token_id=cfg.eos_token_id, pad_token_id=cfg.pad_token_id,
            output_logits=True, return_dict_in_generate=True,
        )
        full = g.sequences[0].tolist()
        fw = ref_model(torch.tensor([full]), output_router_logits=True, use_cache=False)
    usage = []
    router_gap = float("inf")
    for rl in fw.router_logits:
        top = torch.topk(rl.float(), cfg.num_experts_per_tok + 1, dim=-1)
        k = cfg.num_experts_per_tok
        router_gap = min(router_gap, (top.values[:, k - 1] - top.values[:, k]).min().item())
        usage.append(len(set(top.indices[:, :k].flatten().tolist())))
    ref = dict(
        prompt_ids=prompt,
        full_ids=full,
        tf_pred=fw.logits[0].argmax(-1).tolist(),
        dtype="bf16 weights, f32 math",
        prompt_text=prompt_text,
        completion_text=tok.decode(full[len(prompt):], skip_special_tokens=False),
        gen_min_margin=min(top2_margin(l[0]) for l in g.logits),
        tf_min_margin=top2_margin(fw.logits[0]),
        min_router_gap=router_gap,
        expert_usage=usage,
        logits_last=fw.logits[0, -1].tolist(),
        stopped_on_eos=full[-1] in cfg.eos_token_id,
    )
    with open(os.path.join(out, "REF.json"), "w") as f:
        json.dump(ref, f)
        f.write("\n")
    print(f"oracle: {ref['completion_text']!r} gen margin {ref['gen_min_margin']:.3f} "
          f"tf margin {ref['tf_min_margin']:.4f} router gap {router_gap:.4f} usage {usage}", flush=True)

    # ---- samples for the docs ----
    samples = []
    for q in ["What does river mean?", "Hello!", "What is a dog?", "Give me a synonym for happy.",
              "Define music."]:
        ids = tok.encode(render([("user", q)]) + "<|assistant|>\n").ids
        for mode in ("greedy", "sampled"):
            torch.manual_seed(7)
            kw = dict(do_sample=False) if mode == "greedy" else dict(do_sample=True, temperature=0.7, top_p=0.9)
            with torch.no_grad():
                s = ref_model.generate(torch.tensor([ids]), max_new_tokens=64,
                                       eos_token_id=cfg.eos_token_id, pad_token_id=cfg.pad_token_id, **kw)
            text = tok.decode(s[0, len(ids):].tolist(), skip_special_tokens=True)
            samples.append(dict(prompt=q, mode=mode, text=text))
            print(f"[{mode}] {q} -> {text!r}", flush=True)

    with open(os.path.join(out, "TRAINING.json"), "w") as f:
        json.dump(
            dict(
                script="tools/train_tiny_moe.py",
                args=vars(args) | {"out": "models/colibri-tiny"},
                corpus="WordNet 3.0 (Debian wordnet-base 1:3.0-37), WordNet 3.0 licence",
                wordnet_entries=len(entries),
                params=n_params,
                tokens_seen=args.steps * args.batch * SEQ,
                train_seconds=round(train_s),
                held_out_loss=round(held_loss, 4),
                curve=curve,
                samples=samples,
                torch=torch.__version__,
                transformers=__import__("transformers").__version__,
            ),
            f,
            indent=1,
        )
        f.write("\n")
    print(f"done in {time.time() - t0:.0f}s", flush=True)


if __name__ == "__main__":
    sys.exit(main())
