#!/usr/bin/env python3
"""PyTorch float32 eager (transformers) forward + backward on the same checkpoint and ids as
`gemma4 bench DIR --grad`:
    python bench/bench_torch_grad.py DIR [--threads N] [--prompt N]
prints "grad: T tok/s (... best of 3)" for model(ids, labels=ids).loss.backward(), and the same per
CPU-second of the process (the machine may be shared)."""
import argparse
import time

import torch
import transformers

ap = argparse.ArgumentParser()
ap.add_argument("dir")
ap.add_argument("--threads", type=int, default=0)
ap.add_argument("--prompt", type=int, default=256)
a = ap.parse_args()
if a.threads:
    torch.set_num_threads(a.threads)
model = transformers.AutoModelForCausalLM.from_pretrained(a.dir, dtype=torch.float32, attn_implementation="eager")
model.eval()  # dropout off, as gemma4.h's training reference
V = model.config.get_text_config().vocab_size
ids = [(i * 7919 + 13) % V for i in range(a.prompt)]
ids[0] = 2 % V
ids = torch.tensor([ids])
best = best_cpu = float("inf")
for i in range(4):  # a warm-up, then best of 3, as gemma4.h's bench --grad
    model.zero_grad(set_to_none=False)
    t0, c0 = time.perf_counter(), time.process_time()
    loss = model(input_ids=ids, labels=ids, use_cache=False).loss
    loss.backward()
    dt, dc = time.perf_counter() - t0, time.process_time() - c0
    if i:
        best, best_cpu = min(best, dt), min(best_cpu, dc)
print(f"grad: {a.prompt / best:.2f} tok/s (forward + backward of {a.prompt} tokens in {best:.2f} s, best of 3; "
      f"loss {float(loss):.4f}; torch {torch.__version__}, {torch.get_num_threads()} threads)")
# per CPU-second of this process (all its threads), as gemma4.h's "grad per CPU-second" line
print(f"grad per CPU-second: {a.prompt / best_cpu:.2f} tok ({best_cpu:.2f} CPU-s, best of 3)")
