#!/usr/bin/env python3
"""Reference values for tests/tools/tokenizer_test.cpp (GPT-2 byte-level BPE).

Trains a small byte-level BPE (vocab 1000) with Hugging Face `tokenizers` on the Debian fortunes
(GPT-2's pre-tokenizer pattern and byte alphabet), saves it as GPT-2-style vocab.json +
merges.txt under tests/reference/bpe_small/, then encodes a handful of tricky strings with
Hugging Face's `GPT2Tokenizer` loaded from those files (the Rust `tokenizers` backend in
transformers 5) and with a transcription of OpenAI's encoder.py (gpt-2/src/encoder.py, on the
`regex` module). Both must agree; their ids go to bpe_small/reference.json, which the C++
tokenizer must reproduce exactly.

    python3 tests/reference/gen_bpe_reference.py
"""
import glob
import json
import os
import random

import regex
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GPT2Tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "bpe_small")

STRINGS = [
    "Hello, world!",
    "I'm sure you've heard: they'll say it's what we'd do, and I've re-read 'em.",
    "Don'T SHOUT'S ' s 'll '",
    "The year 2024 had 365 days; pi is 3.14159 and 1,000,000 is big.",
    "What?!... Really??? --- (yes) [no] {maybe} <tag/> #$%^&*",
    "two  spaces,   three,    four\tand\ttabs",
    "line one\nline two\n\nparagraph\r\n  indented\n",
    "   leading and trailing   ",
    "café naïve résumé Ünïcödé Straße",
    "Привет, мир! Γειά σου κόσμε. 你好世界 こんにちは",
    "emoji 😀👍🏽 and flags 🇩🇪 and ❤️ hearts",
    "numbers ١٢٣ ४५६ Ⅻ ½ ²",
    "mixed x2 3rd 4th v1.2.3 a1b2c3",
    "\u3000ideographic\u3000space and\u00a0nbsp",
    "",
    " ",
    "\n",
    "a",
    "Q: What do you call a fish with no eyes?\nA: A fsh.\n%\n",
]


def fuzz_strings(count=8, length=200, seed=1234):
    """Random mixes of the characters the pattern treats differently, to exercise every branch."""
    alphabet = list("aZé ßП你1٣½ \t\n\r'sdtmlrve.,!?-_ \u3000\u00a0\u2028\u000b😀\u0301x")
    rng = random.Random(seed)
    return ["".join(rng.choice(alphabet) for _ in range(length)) for _ in range(count)]


class OpenAIEncoder:
    """OpenAI's gpt-2/src/encoder.py, transcribed (an independent second reference)."""

    PAT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

    def __init__(self, vocab_path, merges_path):
        with open(vocab_path, encoding="utf-8") as f:
            self.encoder = json.load(f)
        with open(merges_path, encoding="utf-8") as f:
            lines = f.read().split("\n")[1:-1]
        self.bpe_ranks = {tuple(line.split()): i for i, line in enumerate(lines)}
        bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) +
              list(range(ord("®"), ord("ÿ") + 1)))
        cs = bs[:]
        n = 0
        for b in range(256):
            if b not in bs:
                bs.append(b)
                cs.append(256 + n)
                n += 1
        self.byte_encoder = dict(zip(bs, map(chr, cs)))
        self.pat = regex.compile(self.PAT)

    def bpe(self, token):
        word = tuple(token)
        while len(word) > 1:
            pairs = {(word[i], word[i + 1]) for i in range(len(word) - 1)}
            bigram = min(pairs, key=lambda p: self.bpe_ranks.get(p, float("inf")))
            if bigram not in self.bpe_ranks:
                break
            first, second = bigram
            new_word, i = [], 0
            while i < len(word):
                try:
                    j = word.index(first, i)
                except ValueError:
                    new_word.extend(word[i:])
                    break
                new_word.extend(word[i:j])
                i = j
                if word[i] == first and i < len(word) - 1 and word[i + 1] == second:
                    new_word.append(first + second)
                    i += 2
                else:
                    new_word.append(word[i])
                    i += 1
            word = tuple(new_word)
        return word

    def encode(self, text):
        ids = []
        for token in regex.findall(self.pat, text):
            token = "".join(self.byte_encoder[b] for b in token.encode("utf-8"))
            ids.extend(self.encoder[t] for t in self.bpe(token))
        return ids


def corpus_files():
    files = []
    for path in sorted(glob.glob("/usr/share/games/fortunes/*")):
        if os.path.isfile(path) and not os.path.islink(path) and not path.endswith((".dat", ".u8")):
            files.append(path)
    return files


def main():
    os.makedirs(OUT, exist_ok=True)
    tok = Tokenizer(models.BPE())
    # GPT-2's pattern, no prefix space: what OpenAI's encoder does.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1000,
        min_frequency=2,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train(corpus_files(), trainer)
    tok.model.save(OUT)  # vocab.json + merges.txt
    vocab = os.path.join(OUT, "vocab.json")
    merges = os.path.join(OUT, "merges.txt")

    hf = GPT2Tokenizer(vocab=vocab, merges=merges)
    openai = OpenAIEncoder(vocab, merges)
    cases = []
    for s in STRINGS + fuzz_strings():
        ids = hf.encode(s)
        assert ids == openai.encode(s), (s, ids, openai.encode(s))
        assert hf.decode(ids) == s, s
        # The pre-tokenizer's pieces too, so a mismatch is easy to place.
        cases.append({"text": s, "pieces": regex.findall(openai.pat, s), "ids": ids})
    with open(os.path.join(OUT, "reference.json"), "w", encoding="utf-8") as f:
        json.dump({"vocab_size": len(hf.get_vocab()),
                   "eot": hf.convert_tokens_to_ids("<|endoftext|>"),
                   "cases": cases}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {OUT}: vocab {len(hf.get_vocab())}, {len(cases)} cases")


if __name__ == "__main__":
    main()
