#!/usr/bin/env python3
"""Reference files for tests/models/hf_interop_test.cpp, made with Hugging Face transformers.

A tiny random transformers.GPT2LMHeadModel (vocab 96, n_positions 32, n_embd 32, n_layer 2,
n_head 4) is written with save_pretrained (safetensors) into gpt2_hf_tiny/; only its
model.safetensors is kept (config.json and generation_config.json are removed: the C++ test builds
the matching Strata model from registry overrides). The weights are redrawn with larger scales than
GPT-2's init (LayerNorm affines not 1/0, biases non-zero) so that every term of the computation
shows in the logits. The file is exactly what HF writes: "transformer."-prefixed names, Conv1D
weights [in, out], the LM head tied to wte (and so left out).

gpt2_hf_tiny/logits.safetensors holds "ids" (i64 [2, 20]) and "logits" (f32 [2, 20, 96]) computed by
the same HF model in float64 (so the values carry no fp32 accumulation noise of their own), and the
config in its __metadata__.

Run: python3 tests/reference/gen_gpt2_hf.py   (seconds on CPU; torch + transformers)
"""
import inspect
import os

import torch
from safetensors.torch import save_file
from transformers import GPT2Config, GPT2LMHeadModel

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "gpt2_hf_tiny")
CFG = dict(vocab_size=96, n_positions=32, n_embd=32, n_layer=2, n_head=4)
SEED = 2024


def main():
    torch.manual_seed(SEED)
    config = GPT2Config(**CFG, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        layer_norm_epsilon=1e-5, activation_function="gelu_new",
                        bos_token_id=CFG["vocab_size"] - 1, eos_token_id=CFG["vocab_size"] - 1,
                        tie_word_embeddings=True)
    model = GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".ln_" in name or "ln_f" in name:
                p.copy_((1.0 + 0.1 * torch.randn_like(p)) if name.endswith("weight")
                        else 0.05 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.05 * torch.randn_like(p))
            else:
                p.copy_((0.15 if "c_attn" in name else 0.1) * torch.randn_like(p))
    os.makedirs(OUT, exist_ok=True)
    kwargs = {}
    if "safe_serialization" in inspect.signature(model.save_pretrained).parameters:
        kwargs["safe_serialization"] = True  # the default (and only format) in transformers >= 5
    model.save_pretrained(OUT, **kwargs)
    for extra in os.listdir(OUT):
        if extra != "model.safetensors":
            os.remove(os.path.join(OUT, extra))

    g = torch.Generator().manual_seed(SEED + 1)
    ids = torch.randint(0, CFG["vocab_size"], (2, 20), generator=g)
    with torch.no_grad():
        logits = model.double()(ids).logits.float()
    meta = {k: str(v) for k, v in CFG.items()}
    meta.update({"seed": str(SEED), "generator": "tests/reference/gen_gpt2_hf.py",
                 "transformers": __import__("transformers").__version__})
    save_file({"ids": ids.contiguous(), "logits": logits.contiguous()},
              os.path.join(OUT, "logits.safetensors"), metadata=meta)
    for f in sorted(os.listdir(OUT)):
        print(f"wrote {os.path.join(OUT, f)} ({os.path.getsize(os.path.join(OUT, f))} bytes)")


if __name__ == "__main__":
    main()
