#!/usr/bin/env python3
"""The card's limits and PyTorch eager bf16 (transformers) on the same
checkpoint as bench/cuda_bench.c, in the same run (bench/cuda.sh):
    python bench/bench_torch_cuda.py DIR [--ctx 0,8192,32768] [--gen 32]
Prints "bandwidth: X GB/s", "bf16 peak: Y TFLOP/s" and one line per context
in cuda_bench's format (prefill: a 512-token chunk at the context; decode:
--gen steps after it). Attention is transformers' default (sdpa)."""
import argparse
import time

import torch
import transformers

ap = argparse.ArgumentParser()
ap.add_argument("dir")
ap.add_argument("--ctx", default="0,8192,32768")
ap.add_argument("--gen", type=int, default=32)
ap.add_argument("--no-model", action="store_true")
a = ap.parse_args()
dev = torch.device("cuda")


def timed(fn, reps):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    t = []
    for _ in range(reps):
        s.record()
        fn()
        e.record()
        e.synchronize()
        t.append(s.elapsed_time(e) / 1e3)
    return sorted(t)[len(t) // 2]  # median


# the card: a 4 GiB device-to-device copy (bytes read + written), and an
# 8192^3 bf16 matrix product on random data (mean of medians)
src = torch.randn(1 << 30, device=dev)
dst = torch.empty_like(src)
t = timed(lambda: dst.copy_(src), 10)
print(f"bandwidth: {2 * src.numel() * 4 / t / 1e9:.0f} GB/s (a {src.numel() * 4 >> 30} GiB copy, read + write, median of 10)")
del src, dst
x = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
y = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
t = timed(lambda: x @ y, 20)
print(f"bf16 peak: {2 * 8192**3 / t / 1e12:.0f} TFLOP/s (8192^3 bf16 matmul, median of 20)")
del x, y
torch.cuda.empty_cache()
if a.no_model:
    raise SystemExit(0)

model = transformers.AutoModelForCausalLM.from_pretrained(a.dir, dtype=torch.bfloat16).to(dev).eval()
V = model.config.get_text_config().vocab_size
chunk = 512
for ctx in [int(c) for c in a.ctx.split(",")]:
    n = ctx + chunk + a.gen + 1
    ids = torch.tensor([[(i * 7919 + 13) % V for i in range(n)]], device=dev)
    ids[0, 0] = 2
    with torch.no_grad():
        try:
            model(input_ids=ids[:, :chunk], use_cache=True, logits_to_keep=1)  # warm-up
            torch.cuda.synchronize()
            past = transformers.DynamicCache(config=model.config)
            t0 = time.perf_counter()
            for p in range(0, ctx, chunk):
                out = model(input_ids=ids[:, p:p + chunk], past_key_values=past, use_cache=True, logits_to_keep=1)
            torch.cuda.synchronize()
            t_fill = time.perf_counter() - t0
            t0 = time.perf_counter()
            out = model(input_ids=ids[:, ctx:ctx + chunk], past_key_values=past, use_cache=True, logits_to_keep=1)
            torch.cuda.synchronize()
            t_pre = time.perf_counter() - t0
            nxt = out.logits[:, -1:].argmax(-1)
            t0 = time.perf_counter()
            for _ in range(a.gen):
                out = model(input_ids=nxt, past_key_values=past, use_cache=True)
                nxt = out.logits[:, -1:].argmax(-1)
            torch.cuda.synchronize()
            t_dec = time.perf_counter() - t0
            print(f"torch-bf16 ctx {ctx:6d}: prefill {chunk / t_pre:8.1f} tok/s (512 tokens in {t_pre:.3f} s; "
                  f"filling {ctx} in {t_fill:.1f} s) | decode {a.gen / t_dec:7.1f} tok/s ({a.gen} steps)", flush=True)
            del past, out
        except torch.OutOfMemoryError as e:
            print(f"torch-bf16 ctx {ctx:6d}: out of memory ({str(e)[:80]})")
        torch.cuda.empty_cache()
print(f"PyTorch {torch.__version__}, transformers {transformers.__version__}")
