"""bench/peers.sh's check that llama.cpp runs the same model as gemma4.h.

    python bench/peers_check.py CONFIG.json GEMMA4.f32 LLAMA.f32

Both files hold every prompt position's logits (float32, row-major), from
`gemma4 logits` and bench/llama_logits.cpp on the same ids. The GGUF is bf16
and llama.cpp rounds the activations to bf16 at every matmul (and its GELU
goes through an f16 table), while gemma4.h's default keeps them float32, so
the logits cannot agree bit for bit.

The bar: the mean |difference| must stay under a quarter of the logits' own
spread (mean |logit - row mean|). Measured on the 10-layer E2B-shaped random
checkpoint (2026-11-23, 12 positions): llama.cpp on the bf16 GGUF 0.09 of the
spread, transformers' own bf16 run against its float32 one 0.16; the same
checkpoint converted to an f32 GGUF, flash attention off, 0.004 (argmax 12/12,
max |diff| 0.02); another position's logits (an unrelated row) 1.33. Argmax
agreement is printed, not judged: random weights leave top-1 margins of a few
thousandths.
"""
import json
import sys

import numpy as np


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    vocab = json.load(open(sys.argv[1]))["vocab_size"]
    g4 = np.fromfile(sys.argv[2], dtype=np.float32)
    ll = np.fromfile(sys.argv[3], dtype=np.float32)
    if g4.size == 0 or g4.size % vocab or ll.size != g4.size:
        sys.exit("peers_check: %s has %d floats, %s %d; want the same multiple of vocab_size %d"
                 % (sys.argv[2], g4.size, sys.argv[3], ll.size, vocab))
    g4, ll = g4.reshape(-1, vocab), ll.reshape(-1, vocab)
    spread = float(np.abs(g4 - g4.mean(1, keepdims=True)).mean())
    diff = np.abs(g4 - ll)
    same = int((g4.argmax(1) == ll.argmax(1)).sum())
    corr = min(float(np.corrcoef(a, b)[0, 1]) for a, b in zip(g4, ll))
    ratio = float(diff.mean()) / spread
    print("llama.cpp vs gemma4.h, %d positions: argmax %d/%d the same, mean |diff| %.4f = %.2f of the "
          "logits' spread %.4f (bar 0.25), max |diff| %.3f, lowest correlation %.4f"
          % (len(g4), same, len(g4), diff.mean(), ratio, spread, diff.max(), corr))
    if not ratio < 0.25:
        sys.exit("peers_check: llama.cpp's logits are too far from gemma4.h's: not the same model?")


if __name__ == "__main__":
    main()
