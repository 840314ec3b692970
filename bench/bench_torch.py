#!/usr/bin/env python3
"""PyTorch eager (transformers) on the same checkpoint as `gemma4 bench`:
    python bench/bench_torch.py DIR [--threads N] [--prompt N] [--gen N] [--dtype bfloat16|float32]
prints the same "prefill:" / "decode:" lines, and the prefill per CPU-second of
this process (all its threads), which a shared machine disturbs less than the wall time."""
import argparse
import time

import torch
import transformers

ap = argparse.ArgumentParser()
ap.add_argument("dir")
ap.add_argument("--threads", type=int, default=0)
ap.add_argument("--prompt", type=int, default=64)
ap.add_argument("--gen", type=int, default=16)
ap.add_argument("--dtype", default="bfloat16")
a = ap.parse_args()
if a.threads:
    torch.set_num_threads(a.threads)
model = transformers.AutoModelForCausalLM.from_pretrained(a.dir, dtype=getattr(torch, a.dtype))
model.eval()
V = model.config.get_text_config().vocab_size
ids = torch.tensor([[(i * 7919 + 13) % V for i in range(a.prompt)]])
with torch.no_grad():
    pre = pre_cpu = float("inf")
    for _ in range(3):  # best of 3, as gemma4.h's bench (the first also warms up)
        t0, c0 = time.perf_counter(), time.process_time()
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
        pre = min(pre, time.perf_counter() - t0)
        pre_cpu = min(pre_cpu, time.process_time() - c0)  # this process's CPU time, all its threads
    dec = float("inf")
    for rep in range(3):  # decode: best of 3, each after a fresh prefill
        if rep:
            out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
        t1 = time.perf_counter()
        past = out.past_key_values
        nxt = out.logits[:, -1:].argmax(-1)
        for _ in range(a.gen):
            out = model(input_ids=nxt, past_key_values=past, use_cache=True)
            past = out.past_key_values
            nxt = out.logits[:, -1:].argmax(-1)
        dec = min(dec, time.perf_counter() - t1)
print(f"model: {a.dir}, PyTorch {torch.__version__} eager {a.dtype}, {torch.get_num_threads()} threads")
print(f"prefill: {a.prompt / pre:.2f} tok/s ({a.prompt} tokens in {pre:.2f} s, best of 3)")
print(f"decode: {a.gen / dec:.2f} tok/s ({a.gen} tokens in {dec:.2f} s, best of 3)")
print(f"prefill per CPU-second: {a.prompt / pre_cpu:.2f} tok ({pre_cpu:.3f} CPU-s, best of 3)")
