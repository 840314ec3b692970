"""bench/peers.sh's check that llama.cpp runs the same model as gemma4.h.

    python3 bench/peers_check.py CONFIG.json GEMMA4.f32 LLAMA.f32 GEMMA4_BF16.f32

The files hold every prompt position's logits (float32, row-major) on the same
ids: gemma4.h's float32 run (`gemma4 logits`), llama.cpp's
(bench/llama_logits.cpp) and gemma4.h's bf16-faithful run (`gemma4 logits
--bf16`). The GGUF is bf16 and llama.cpp rounds the activations to bf16 at
every matmul (and its GELU goes through an f16 table), while gemma4.h's
default keeps them float32, so the logits cannot agree bit for bit; how far
bf16 arithmetic alone moves them depends on the model (its depth, its random
weights).

The bar is measured in the same check, on the same model: the distance of a
run is its mean |difference| from gemma4.h's float32 logits, in units of the
logits' own spread (mean |logit - row mean|). gemma4.h's bf16-faithful run
(transformers' bf16 arithmetic) gives the model's own float32-to-bf16 gap;
llama.cpp, another bf16 implementation, must stay within twice that gap. A
different model is far outside it: the logits of an unrelated row (each
position against the next one's) are printed beside it, and the check refuses
to judge when twice the gap reaches them (it could not tell a wrong model).
Measured (2026-11): on the 10-layer E2B-shaped random checkpoint llama.cpp was
0.09 of the spread and transformers' bf16 run 0.16; on the full 35-layer shape
llama.cpp 0.32 and gemma4.h's bf16-faithful run 0.37, which a fixed bar of 0.25
wrongly failed; an unrelated row 1.33. Argmax agreement is printed, not judged:
random weights leave top-1 margins of a few thousandths.

Plain Python (no numpy): it runs wherever python3 does (tests/test_cli.c).
"""
import json
import sys
from array import array


def load(path, vocab):
    a = array("f")
    with open(path, "rb") as f:
        a.frombytes(f.read())
    if sys.byteorder != "little":
        a.byteswap()
    if len(a) == 0 or len(a) % vocab:
        sys.exit("peers_check: %s has %d floats, not a positive multiple of vocab_size %d" % (path, len(a), vocab))
    return [a[i:i + vocab] for i in range(0, len(a), vocab)]


def mean_abs_diff(x, y):
    n = sum(len(r) for r in x)
    return sum(abs(p - q) for rx, ry in zip(x, y) for p, q in zip(rx, ry)) / n


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    vocab = json.load(open(sys.argv[1]))["vocab_size"]
    g4, ll, bf = (load(p, vocab) for p in sys.argv[2:5])
    if not len(g4) == len(ll) == len(bf):
        sys.exit("peers_check: %d, %d and %d rows; want the same positions in all three" % (len(g4), len(ll), len(bf)))
    means = [sum(r) / vocab for r in g4]  # (once per row: inside the sum below it made the check quadratic in vocab)
    spread = sum(abs(v - mu) for r, mu in zip(g4, means) for v in r) / (len(g4) * vocab)
    if not spread > 0:
        sys.exit("peers_check: %s's logits have no spread" % sys.argv[2])
    peer = mean_abs_diff(g4, ll) / spread
    gap = mean_abs_diff(g4, bf) / spread
    other = mean_abs_diff(g4[1:], g4[:-1]) / spread if len(g4) > 1 else float("inf")
    argmax = [max(range(vocab), key=r.__getitem__) for r in g4]
    same = sum(a == max(range(vocab), key=r.__getitem__) for a, r in zip(argmax, ll))
    print("llama.cpp vs gemma4.h, %d positions: mean |diff| %.2f of the logits' spread %.4f; gemma4.h's own "
          "float32-to-bf16 gap %.2f (bar: twice it, %.2f); an unrelated row %.2f; argmax %d/%d the same"
          % (len(g4), peer, spread, gap, 2 * gap, other, same, len(g4)))
    if not 2 * gap < other:
        sys.exit("peers_check: twice the bf16 gap (%.2f) reaches an unrelated row's distance (%.2f): "
                 "this check cannot tell the models apart" % (2 * gap, other))
    if not peer <= 2 * gap:
        sys.exit("peers_check: llama.cpp's logits are %.2f of the spread from gemma4.h's, more than twice its own "
                 "float32-to-bf16 gap (%.2f): not the same model?" % (peer, gap))


if __name__ == "__main__":
    main()
