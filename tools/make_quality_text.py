#!/usr/bin/env python3
# Writes fixtures/quality/wordnet-heldout.txt: chat dialogues in the bundled
# model's training format, built from WordNet glosses by the same functions
# tools/train_tiny_moe.py trains with, under a seed the training never used
# (training: its --seed; held-out loss: 999999; this file: 777001). `coli
# quality` scores quantized containers against the f32 checkpoint on it.
#
# Pinned versions: Python 3.11+, standard library only besides what
# tools/train_tiny_moe.py imports at module level (torch==2.15.0 or 2.9.1,
# transformers==5.23.0, tokenizers==0.23.3; nothing of them runs here).
# Corpus: WordNet 3.0, Debian `wordnet-base` (1:3.0-37), /usr/share/wordnet.
# Run: /work/bench-data/peers/venv/bin/python tools/make_quality_text.py [N]
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import train_tiny_moe as t  # noqa: E402

n = int(sys.argv[1]) if len(sys.argv) > 1 else 24
dialogues = t.build_dialogues(t.load_wordnet(), 777001, n)
out = HERE.parent / "fixtures" / "quality" / "wordnet-heldout.txt"
out.parent.mkdir(parents=True, exist_ok=True)
out.write_text("".join(dialogues))
print(f"{out}: {n} dialogues, {sum(len(d) for d in dialogues)} characters")
