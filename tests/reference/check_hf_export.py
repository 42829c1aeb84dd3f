#!/usr/bin/env python3
"""Checks a directory written by `convert --to-hf` (tests/tools/convert_test.cpp).

usage: check_hf_export.py HF_DIR EXPECTED.safetensors

Loads HF_DIR with transformers.GPT2LMHeadModel.from_pretrained, requires that every weight came
from the file (nothing missing but the tied lm_head, nothing unexpected or mismatched), runs it in
float64 on EXPECTED's "ids" and compares with EXPECTED's "logits" (Strata's fp32 forward, already
cut to vocab_size) at the tolerance of tests/models/gpt2_reference_test.cpp. Prints the largest
difference; exits 0 on a match, 1 otherwise.
"""
import sys

import torch
from safetensors.torch import load_file
from transformers import GPT2LMHeadModel

RTOL, ATOL = 1e-4, 1e-5


def main():
    hf_dir, expected_path = sys.argv[1], sys.argv[2]
    model, info = GPT2LMHeadModel.from_pretrained(hf_dir, output_loading_info=True)
    missing = [k for k in info.get("missing_keys", []) if k != "lm_head.weight"]
    problems = missing + list(info.get("unexpected_keys", [])) + \
        [str(k) for k in info.get("mismatched_keys", [])]
    if problems:
        print(f"check_hf_export: loading {hf_dir} reported {problems}")
        return 1
    if model.lm_head.weight.data_ptr() != model.transformer.wte.weight.data_ptr():
        print("check_hf_export: lm_head is not tied to wte")
        return 1
    expected = load_file(expected_path)
    model = model.double().eval()
    with torch.no_grad():
        logits = model(expected["ids"].long()).logits
    want = expected["logits"].double()
    if logits.shape != want.shape:
        print(f"check_hf_export: logits shape {tuple(logits.shape)} vs {tuple(want.shape)}")
        return 1
    diff = (logits - want).abs()
    print(f"check_hf_export: max |logit diff| transformers vs Strata {diff.max().item():.3e}")
    ok = bool((diff <= ATOL + RTOL * want.abs()).all())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
