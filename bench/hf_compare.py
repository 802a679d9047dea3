"""Loads a `neuroshard export` folder with transformers' AutoModelForCausalLM and compares its
logits with NeuroShard's own on the same tokens.

Usage: hf_compare.py EXPORT_DIR OURS_JSON   (OURS_JSON from `neuroshard logits`)
"""
import json
import sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def main():
    export_dir, ours_path = sys.argv[1], sys.argv[2]
    with open(ours_path) as f:
        ours = json.load(f)
    tokens = ours["tokens"]
    model = AutoModelForCausalLM.from_pretrained(
        export_dir, torch_dtype=torch.float32, attn_implementation="eager"
    )
    model.eval()
    with torch.no_grad():
        hf = model(torch.tensor([tokens])).logits[0].numpy()
    mine = np.array(ours["logits"], dtype=np.float32).reshape(hf.shape)
    diff = float(np.abs(hf - mine).max())
    scale = float(np.abs(hf).max())
    same_argmax = bool((hf.argmax(-1) == mine.argmax(-1)).all())
    result = {
        "tokens": len(tokens),
        "vocab": hf.shape[-1],
        "max_abs_diff": diff,
        "max_abs_logit": scale,
        "same_argmax": same_argmax,
        "pass": diff <= 1e-4,
    }
    try:
        tok = AutoTokenizer.from_pretrained(export_dir)
        result["tokenizer_loads"] = True
        result["decoded_sample"] = tok.decode(tokens[:16])
    except Exception as e:  # the export may have no tokenizer.json
        result["tokenizer_loads"] = f"no: {e}"
    print(json.dumps(result))
    sys.exit(0 if result["pass"] else 1)


if __name__ == "__main__":
    main()
