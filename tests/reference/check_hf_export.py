#!/usr/bin/env python3
"""Checks a directory written by `convert --to-hf` (tests/tools/convert_test.cpp).

usage: check_hf_export.py HF_DIR EXPECTED.safetensors

Loads HF_DIR with transformers.AutoModelForCausalLM.from_pretrained (the architecture its
config.json names: GPT2LMHeadModel, LlamaForCausalLM), requires that every weight came from the
file (nothing missing but a tied lm_head, nothing unexpected or mismatched) and that the head is
tied exactly when config.json says so, runs it in float64 on EXPECTED's "ids" and compares with
EXPECTED's "logits" (Strata's fp32 forward) at the tolerance of
tests/models/gpt2_reference_test.cpp; logits beyond the exported vocab_size (Strata's padding)
are ignored. Prints the largest difference; exits 0 on a match, 1 otherwise.
"""
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

RTOL, ATOL = 1e-4, 1e-5


def main():
    hf_dir, expected_path = sys.argv[1], sys.argv[2]
    model, info = AutoModelForCausalLM.from_pretrained(hf_dir, output_loading_info=True)
    tied = bool(model.config.tie_word_embeddings)
    missing = [k for k in info.get("missing_keys", []) if not (tied and k == "lm_head.weight")]
    problems = missing + list(info.get("unexpected_keys", [])) + \
        [str(k) for k in info.get("mismatched_keys", [])]
    if problems:
        print(f"check_hf_export: loading {hf_dir} reported {problems}")
        return 1
    same = model.get_output_embeddings().weight.data_ptr() == \
        model.get_input_embeddings().weight.data_ptr()
    if same != tied:
        print(f"check_hf_export: lm_head tied {same}, config.json says {tied}")
        return 1
    expected = load_file(expected_path)
    model = model.double().eval()
    with torch.no_grad():
        logits = model(expected["ids"].long()).logits
    want = expected["logits"].double()[..., : model.config.vocab_size]
    if logits.shape != want.shape:
        print(f"check_hf_export: logits shape {tuple(logits.shape)} vs {tuple(want.shape)}")
        return 1
    diff = (logits - want).abs()
    print(f"check_hf_export: {type(model).__name__}: max |logit diff| transformers vs Strata "
          f"{diff.max().item():.3e}")
    ok = bool((diff <= ATOL + RTOL * want.abs()).all())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
