#!/usr/bin/env python3
# Vocab-only GGUF files written by llama.cpp's own converter, one per tokenizer
# family colibri runs, with two references for tests/gguf_tokenizer.rs: the
# Hugging Face tokenizer.json each was converted from (loaded by the Rust
# `tokenizers` crate at test time) and llama.cpp's own tokenization of a
# hostile corpus (ids and decoded text, recorded here in REF.json).
#
# Writes into fixtures/gguf/tokenizers/<family>/:
#   tokenizer.json   the Hugging Face tokenizer (the first reference)
#   vocab.gguf       convert_hf_to_gguf.py --vocab-only of that directory
# and fixtures/gguf/tokenizers/REF.json: the corpus and, per family and line,
# llama.cpp's ids (llama_tokenize, add_special false and true, parse_special
# true), its detokenized text (remove_special false, unparse_special true),
# and the ids of the Hugging Face tokenizer (transformers' fast tokenizer).
#
# Why synthetic tokenizers: the tokenizers under fixtures/*-tiny are all one
# GPT-2-style byte-level BPE of a few hundred tokens, and the real ones of
# these families are megabytes each. So each family here is a small BPE
# (about 1000 tokens) trained on the corpus below with *no* pre-tokenizer
# (its merges cross spaces, digits and punctuation, so any difference in how
# a pre-tokenizer splits shows in the ids), then given the family's real
# pre-tokenizer, normalizer, decoder, ignore_merges and special tokens as the
# family's own tokenizer.json has them. The SentencePiece family (Mixtral /
# Llama 2) is a sentencepiece BPE model with byte fallback, turned into
# tokenizer.json by transformers' LlamaTokenizerFast (legacy, as Mixtral's).
#
# Pinned versions (the committed files were produced with exactly these):
#   llama.cpp as vendored by llama-cpp-python 0.3.36 (gguf-py 0.19.0), its
#     libllama built from that tree (llama-server-build), driven through the
#     llama-cpp-python 0.3.36 ctypes bindings
#   transformers==4.57.1  tokenizers==0.22.2  sentencepiece==0.2.3
#   protobuf==7.36.2  numpy==2.4.6  torch==2.9.1
# Not byte-reproducible: the tokenizers BPE trainer breaks ties between
# equally frequent pairs in hash order, so two runs train different (equally
# valid) vocabularies; the tests read whichever run was committed, and pass
# on either.
# Run (CPU only):
#   LLAMA_CPP_LIB_PATH=/work/bench-data/peers/llama-server-build/bin \
#   /work/bench-data/peers/venv/bin/python tools/make_gguf_tokenizer_fixtures.py \
#       /work/bench-data/peers/sdist/llama_cpp_python-0.3.36
import json
import os
import shutil
import subprocess
import sys
import tempfile
import types

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
OUT = os.path.join(REPO, "fixtures", "gguf", "tokenizers")

# The hostile corpus: every line is tokenized on its own.
CORPUS = [
    "Hello world",
    "hello   world  ",
    "  leading spaces and trailing   ",
    "tabs\tand\t\ttabs",
    "new\nlines\n\n\nand\r\nCRLF\r\n",
    "digits 1234567 and 3.14159 and 1,000,000",
    "don't you've we'll I'm they'd it's 'S 'T 'RE 'Ll",
    "DON'T YOU'VE Shouldn't",
    "fn main() { println!(\"{}\", x + 1); }",
    "def f(x):\n    return x ** 2  # comment",
    "<html><body class=\"a\">&amp;</body></html>",
    "中文字符和日本語のテキスト、カタカナ",
    "한국어 텍스트",
    "emoji 😀👍🏽 and 👨‍👩‍👧 family",
    "combining e\u0301 a\u0308 n\u0303 and precomposed é ä ñ",
    "Ünïcödé ÀÉÎÕÜ ßſ ﬁ",
    "mixed CamelCaseWords and snake_case_words",
    "!!!??? ... --- *** ///",
    "    indented\n\t\tmore",
    " ",
    "a",
    "",
    "\n",
    "x\u00a0y\u2003z\u3000w",
    "Ωμέγα Привет мир",
    "ab12cd34ef 9999999999",
]

# Special-token text, per family, appended as extra corpus lines so the
# split on special tokens (and the space prefix after them) is exercised.
SPECIAL_LINES = {
    "olmoe": ["hi<|endoftext|>there", "<|pad|> <|endoftext|>\n"],
    "qwen2": ["<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", "x<|endoftext|>y"],
    "deepseek-v3": ["<｜begin▁of▁sentence｜>hi<｜end▁of▁sentence｜>", "a <｜end▁of▁sentence｜> b"],
    "glm4": ["[gMASK]<sop><|user|>\nhi<|assistant|>", "end<|endoftext|> <|observation|>"],
    "gpt-oss": ["<|start|>user<|message|>hi<|end|><|start|>assistant", "<|return|> x"],
    "chatglm-bpe": ["[gMASK]<sop><|user|>\nhi<|assistant|>", "end<|endoftext|> <|observation|>"],
    "tekken": ["<s>[INST] hi [/INST]</s>", "a </s> b"],
    "llama-bpe": ["<|begin_of_text|>hi<|eot_id|>", "a <|end_of_text|>b"],
    "mixtral": ["<s>hi</s>", "a </s> b", "[INST] hi [/INST]"],
}

TRAIN_TEXT_FILES = ["README.md", "docs/gguf.md", "docs/formats.md"]

# The families: the converter's pre-tokenizer name, the architecture that
# picks the converter's model class, the pre-tokenizer, normalizer and
# ignore_merges of the family's own tokenizer.json, its special tokens.
QWEN2_RE = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_RE = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
O200K_RE = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
TEKKEN_RE = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
DSV3_RES = [
    r"\p{N}{1,3}",
    r"[一-龥぀-ゟ゠-ヿ]+",
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
]


def split(pattern):
    return {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False}


BYTE_LEVEL_NOREGEX = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
BYTE_LEVEL_REGEX = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}

FAMILIES = {
    "olmoe": dict(
        pre="olmo", arch="OlmoeForCausalLM", src="olmoe-tiny",
        pre_tokenizer=BYTE_LEVEL_REGEX, normalizer=None, ignore_merges=False,
        specials=["<|endoftext|>", "<|pad|>"], bos=None, eos="<|endoftext|>", pad="<|pad|>",
        add_bos=False,
    ),
    "qwen2": dict(
        pre="qwen2", arch="Qwen3MoeForCausalLM", src="qwen3-moe-tiny",
        pre_tokenizer={"type": "Sequence", "pretokenizers": [split(QWEN2_RE), BYTE_LEVEL_NOREGEX]},
        normalizer={"type": "NFC"}, ignore_merges=False,
        specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"], bos=None, eos="<|im_end|>",
        pad="<|endoftext|>", add_bos=False, pad_vocab=3,
    ),
    "deepseek-v3": dict(
        pre="deepseek-v3", arch="DeepseekV3ForCausalLM", src="deepseek-v3-tiny",
        pre_tokenizer={"type": "Sequence", "pretokenizers": [split(r) for r in DSV3_RES] + [BYTE_LEVEL_NOREGEX]},
        normalizer=None, ignore_merges=False,
        specials=["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"],
        bos="<｜begin▁of▁sentence｜>", eos="<｜end▁of▁sentence｜>", pad="<｜end▁of▁sentence｜>",
        add_bos=True,
    ),
    "glm4": dict(
        pre="glm4", arch="Glm4MoeForCausalLM", src="glm4-moe-tiny",
        pre_tokenizer={"type": "Sequence", "pretokenizers": [split(LLAMA3_RE), BYTE_LEVEL_NOREGEX]},
        normalizer=None, ignore_merges=True,
        specials=["<|endoftext|>", "[gMASK]", "<sop>", "<|user|>", "<|assistant|>", "<|observation|>"],
        bos=None, eos="<|endoftext|>", pad="<|endoftext|>", add_bos=False,
    ),
    "gpt-oss": dict(
        pre="gpt-4o", arch="GptOssForCausalLM", src="gpt-oss-tiny",
        pre_tokenizer={"type": "Sequence", "pretokenizers": [split(O200K_RE), BYTE_LEVEL_NOREGEX]},
        normalizer=None, ignore_merges=False,
        specials=["<|startoftext|>", "<|endoftext|>", "<|return|>", "<|start|>", "<|end|>", "<|message|>"],
        bos="<|startoftext|>", eos="<|return|>", pad="<|endoftext|>", add_bos=False,
    ),
    "chatglm-bpe": dict(
        pre="chatglm-bpe", arch="Glm4MoeForCausalLM", src="glm4-moe-tiny",
        pre_tokenizer={"type": "Sequence", "pretokenizers": [split(LLAMA3_RE), BYTE_LEVEL_NOREGEX]},
        normalizer=None, ignore_merges=False,
        specials=["<|endoftext|>", "[gMASK]", "<sop>", "<|user|>", "<|assistant|>", "<|observation|>"],
        bos=None, eos="<|endoftext|>", pad="<|endoftext|>", add_bos=False,
    ),
    "tekken": dict(
        pre="tekken", arch="MistralForCausalLM", src="mixtral-tiny",
        pre_tokenizer={"type": "Sequence", "pretokenizers": [split(TEKKEN_RE), BYTE_LEVEL_NOREGEX]},
        normalizer=None, ignore_merges=True,
        specials=["<unk>", "<s>", "</s>", "[INST]", "[/INST]"],
        bos="<s>", eos="</s>", pad=None, add_bos=True,
    ),
    "llama-bpe": dict(
        pre="llama-bpe", arch="LlamaForCausalLM", src="mixtral-tiny",
        pre_tokenizer={"type": "Sequence", "pretokenizers": [split(LLAMA3_RE), BYTE_LEVEL_NOREGEX]},
        normalizer=None, ignore_merges=True,
        specials=["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"],
        bos="<|begin_of_text|>", eos="<|eot_id|>", pad=None, add_bos=True,
    ),
}


def training_text():
    parts = []
    for f in TRAIN_TEXT_FILES:
        with open(os.path.join(REPO, f), encoding="utf-8") as fh:
            parts.append(fh.read())
    lines = CORPUS + [line for v in SPECIAL_LINES.values() for line in v]
    # The corpus itself many times, so its words, digit runs, whitespace runs
    # and the joins between them become merges (what makes every family's
    # pre-tokenizer visible in the ids: tests/gguf_tokenizer.rs checks that
    # swapping in another family's changes them).
    parts.extend(lines * 20)
    return parts


def train_bpe(family, spec, texts):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1000,
        min_frequency=2,
        special_tokens=spec["specials"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        max_token_length=12,
        show_progress=False,
    )
    # Trained on whole paragraphs (no pre-tokenizer), so merges span pieces.
    tok.train_from_iterator(texts, trainer=trainer)
    j = json.loads(tok.to_str())
    j["pre_tokenizer"] = spec["pre_tokenizer"]
    j["normalizer"] = spec["normalizer"]
    j["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    j["model"]["ignore_merges"] = spec["ignore_merges"]
    vocab = j["model"]["vocab"]
    if spec["add_bos"]:
        bos = spec["bos"]
        j["post_processor"] = {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [
                {"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}},
            ],
            "special_tokens": {bos: {"id": bos, "ids": [vocab[bos]], "tokens": [bos]}},
        }
    else:
        j["post_processor"] = None
    return j, len(vocab)


def write_hf_dir(d, family, spec, tokenizer_json, n_vocab):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as fh:
        json.dump(tokenizer_json, fh, ensure_ascii=False, indent=1)
    cfg_src = os.path.join(REPO, "fixtures", spec["src"], "config.json")
    with open(cfg_src) as fh:
        cfg = json.load(fh)
    cfg["architectures"] = [spec["arch"]]
    cfg["vocab_size"] = n_vocab + spec.get("pad_vocab", 0)
    for k in ("bos_token_id", "eos_token_id", "pad_token_id"):
        cfg.pop(k, None)
    with open(os.path.join(d, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=1)
    tc = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": spec["bos"],
        "eos_token": spec["eos"],
        "pad_token": spec["pad"],
        "add_bos_token": spec["add_bos"],
        "add_eos_token": False,
        "model_max_length": 512,
    }
    with open(os.path.join(d, "tokenizer_config.json"), "w") as fh:
        json.dump(tc, fh, ensure_ascii=False, indent=1)


def make_spm(d, texts):
    """A sentencepiece BPE model with byte fallback, and the tokenizer.json
    transformers makes of it (legacy LlamaTokenizerFast, as Mixtral ships)."""
    import sentencepiece as spm
    from transformers import LlamaTokenizerFast

    os.makedirs(d, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        train = os.path.join(tmp, "train.txt")
        with open(train, "w", encoding="utf-8") as fh:
            for t in texts:
                for line in t.split("\n"):
                    if line.strip():
                        fh.write(line + "\n")
        spm.SentencePieceTrainer.train(
            input=train,
            model_prefix=os.path.join(d, "tokenizer"),
            model_type="bpe",
            vocab_size=700,
            byte_fallback=True,
            character_coverage=0.9995,
            split_digits=True,
            allow_whitespace_only_pieces=True,
            remove_extra_whitespaces=False,
            normalization_rule_name="identity",
            unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
            user_defined_symbols=["[INST]", "[/INST]"],
            num_threads=1,
            minloglevel=2,
        )
    os.remove(os.path.join(d, "tokenizer.vocab"))
    tok = LlamaTokenizerFast(vocab_file=os.path.join(d, "tokenizer.model"), legacy=True, add_prefix_space=True,
                             add_bos_token=True, add_eos_token=False, from_slow=True)
    tok.save_pretrained(d)
    for extra in ("special_tokens_map.json",):
        p = os.path.join(d, extra)
        if os.path.exists(p):
            os.remove(p)
    with open(os.path.join(REPO, "fixtures", "mixtral-tiny", "config.json")) as fh:
        cfg = json.load(fh)
    cfg["architectures"] = ["MixtralForCausalLM"]
    cfg["vocab_size"] = len(tok)
    with open(os.path.join(d, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=1)


RUNNER = """
import sys
src = sys.argv.pop(1)
pre = sys.argv.pop(1)
sys.path.insert(0, src + "/gguf-py")
sys.path.insert(0, src)
import conversion.base as base
if pre != "-":
    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
import convert_hf_to_gguf
convert_hf_to_gguf.main()
"""


def convert(llama_cpp, d, pre, outfile):
    cmd = [sys.executable, "-c", RUNNER, llama_cpp, pre, d, "--vocab-only", "--outfile", outfile]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)


def llama_cpp_reference(sdist, gguf_path, lines):
    # llama-cpp-python's high-level module imports diskcache, which the
    # venv lacks and vocab-only use never touches.
    sys.modules.setdefault("diskcache", types.SimpleNamespace(Cache=object))
    sys.path.insert(0, sdist)
    import llama_cpp

    m = llama_cpp.Llama(gguf_path, vocab_only=True, verbose=False)
    out = []
    for line in lines:
        b = line.encode("utf-8")
        ids = m.tokenize(b, add_bos=False, special=True) if b else []
        ids_special = m.tokenize(b, add_bos=True, special=True)
        text = m.detokenize(ids, special=True).decode("utf-8", errors="replace") if ids else ""
        out.append({"ids": ids, "ids_add_special": ids_special, "decoded": text})
    return out


def hf_reference(d, lines):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(d)
    return [tok(line, add_special_tokens=False)["input_ids"] for line in lines]


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: make_gguf_tokenizer_fixtures.py <llama-cpp-python sdist dir>")
    sdist = sys.argv[1]
    llama_cpp_src = os.path.join(sdist, "vendor", "llama.cpp")
    texts = training_text()
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    ref = {"corpus": CORPUS, "families": {}}
    for family, spec in list(FAMILIES.items()) + [("mixtral", None)]:
        d = os.path.join(OUT, family)
        with tempfile.TemporaryDirectory() as top:
            # A fixed directory name: the converter stores it as general.name.
            tmp = os.path.join(top, family)
            os.makedirs(tmp)
            if spec is None:
                make_spm(tmp, texts)
                pre = "-"
            else:
                tj, n = train_bpe(family, spec, texts)
                write_hf_dir(tmp, family, spec, tj, n)
                pre = spec["pre"]
            os.makedirs(d)
            gguf_path = os.path.join(d, "vocab.gguf")
            convert(llama_cpp_src, tmp, pre, gguf_path)
            shutil.copy(os.path.join(tmp, "tokenizer.json"), os.path.join(d, "tokenizer.json"))
            lines = CORPUS + SPECIAL_LINES[family]
            ref["families"][family] = {
                "extra_lines": SPECIAL_LINES[family],
                "llama_cpp": llama_cpp_reference(sdist, gguf_path, lines),
                "hf_ids": hf_reference(tmp, lines),
            }
    with open(os.path.join(OUT, "REF.json"), "w", encoding="utf-8") as fh:
        json.dump(ref, fh, ensure_ascii=False, indent=None, separators=(",", ":"))
        fh.write("\n")


if __name__ == "__main__":
    main()
