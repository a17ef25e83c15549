#!/usr/bin/env python3
"""Checks the CUDA engine against Hugging Face transformers.

`gpu_bench --hf-dir DIR` writes a checkpoint (the small preset, fp32) to DIR,
serves it with the built-in engine on CUDA and records, per prompt, the
prompt's tokens and the engine's greedy tokens and logprobs in
DIR/stitch_cuda.json. This script loads DIR with transformers'
LlamaForCausalLM, runs each whole sequence, and compares the log-softmax at
every generated position with the engine's logprob of its token, and the
argmax with its token. Prints one JSON object; exits 1 outside the stated
tolerance (1e-3 in logprob, no greedy disagreement beyond near-ties).
"""
import json
import sys

import torch
from transformers import LlamaForCausalLM

TOLERANCE = 1e-3
NEAR_TIE = 1e-4


def main(directory: str) -> int:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    # `dtype` is transformers' current name (older ones take `torch_dtype`
    # and pass this one on unused); .float() settles it either way.
    model = LlamaForCausalLM.from_pretrained(directory, dtype=torch.float32)
    model = model.float().to("cuda").eval()
    with open(f"{directory}/stitch_cuda.json") as f:
        records = json.load(f)
    worst = 0.0
    disagreements = 0
    compared = 0
    for r in records:
        prompt = r["prompt_tokens"]
        sequence = prompt + r["tokens"]
        ids = torch.tensor([sequence], device="cuda")
        with torch.no_grad():
            logits = model(ids).logits[0].double()
        logp = torch.log_softmax(logits, dim=-1)
        for i, (token, logprob) in enumerate(zip(r["tokens"], r["logprobs"])):
            row = logp[len(prompt) - 1 + i]
            worst = max(worst, abs(row[token].item() - logprob))
            best = int(torch.argmax(row))
            if best != token and row[best].item() - row[token].item() > NEAR_TIE:
                disagreements += 1
            compared += 1
    ok = worst <= TOLERANCE and disagreements == 0 and compared > 0
    print(json.dumps({"hf_tokens_compared": compared,
                      "hf_logprob_max_abs_diff": worst,
                      "hf_greedy_disagreements": disagreements,
                      "hf_tolerance": TOLERANCE,
                      "hf_ok": ok}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
