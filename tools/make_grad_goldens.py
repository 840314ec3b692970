#!/usr/bin/env python3
"""Gradient goldens for gemma4.h's training reference, from torch autograd on transformers.

For every tiny model in data/tiny (made by tools/make_goldens.py) this loads the checkpoint
with from_pretrained(dtype=float32, attn_implementation="eager", experts_implementation="eager"),
runs model(input_ids, labels=labels) in eval mode (dropout off), calls loss.backward() and writes

    data/tiny/<name>/grad_golden.safetensors

holding (no metadata, byte-reproducible):

    input_ids            I32 [S]      S = 24 > sliding_window (8); contains the pad id 0
                                      (nn.Embedding(padding_idx=0) gives that row no lookup gradient)
    labels               I32 [S]      = input_ids with -100 at LABEL_IGNORED positions
    loss                 F32 [1]      model(input_ids, labels=labels).loss
    loss64               F32 [1]      the same loss from the float64 model
    gstat.<param>        F32 [2+NPROJ] for EVERY parameter with a gradient, named as in the
                                      checkpoint (tied lm_head: under embed_tokens): sum of squares,
                                      max |g|, then <g, r_j> for the pseudo-random sign vectors r_j
                                      defined in sign_vector() (computed identically in C)
    grad.<param>         F32 [shape]  the full gradient: every parameter with <= FULL_MAX elements
                                      (norm weights, router scale / per_expert_scale, ...);
    gradq.<param>        I16 [shape]  FULL_MODELS' larger gradients, quantized against their own
                                      max: round(g / m * 32767), m = gstat[1] = max |g|, so
                                      q * m / 32767 is within m / 65534 (1.53e-5 of m) of g, every
                                      element; the tests compare max |ours - g| with 1e-4 * m and
                                      add that 1.53e-5 to what they measure (never looser than F32);
                                      a matrix with more than FULL_MAX elements whose rows are
                                      mostly exactly zero (e2b_like's PLE table: only the rows of
                                      the sequence's ids get a gradient) is stored as its nonzero
                                      rows [k, cols] with
    grad_rows.<param>    I32 [k]      their row indices, ascending; every other row is exactly 0
    grad.embed_tokens    F32 [S, H]   dL/d(scaled embedding entering layer 0)
    grad.layers.<i>      F32 [S, H]   dL/d(output of decoder layer i)
                                      (the names tools/hf_dump.py --grad uses: `build/gemma4 compare
                                      DIR DIR/grad_golden.safetensors` checks the loss, these and
                                      the stored parameter gradients); FULL_MODELS only, the
                                      golden that test_train runs `compare` on (no test reads
                                      them elsewhere; tools/hf_dump.py --grad writes them for any
                                      model)
    fd.<param>           F32 [k, 2]   rows (flat element index, dL/dtheta) from central finite
                                      differences of the float64 model's loss (h = FD_H): a second
                                      oracle that does not use autograd

The set of gstat.* keys IS the gradient set transformers trains (reader layers have no
k_proj/v_proj/k_norm modules; layer_scalar is a buffer; vision/audio towers get no gradient).

Size choice (data/ is kept small): full float32 gradients of all seven models would be 7.3 MB.
e2b_like (shared KV + PLE + double-wide MLP, the model the seeds' failures are about) is stored
in full, every element (~1 MB: its PLE table gradient by nonzero rows, see grad_rows above, its
larger tensors as gradq: half the bytes of float32 at 1.53e-5 of the tensor's max, against the
tests' 1e-4); for the other models every tensor gets the exact sum of squares, max |g| and
NPROJ sign projections, plus the full small tensors. What that catches: any error whose
projection on one of the NPROJ random sign vectors exceeds the tolerance (a dense error of
relative size e shifts each projection by ~e*||g||; NPROJ independent signs make a miss
vanishingly unlikely), any change of the norm or of the largest element. What it cannot catch:
a sparse error (a few elements) smaller than ~tol*||g||_2 that leaves max |g| alone.

Run from the repository root:
    venv/bin/python tools/make_grad_goldens.py [--only name ...]
"""

import argparse
import os
import sys

import numpy as np
import torch
import transformers
from safetensors import safe_open

from make_goldens import kept_model_lines, versions_header  # tools/, beside this file
from safetensors.torch import save_file

assert torch.__version__.startswith("2.15"), torch.__version__
assert transformers.__version__ == "5.23.0", transformers.__version__

from transformers import Gemma4ForCausalLM, Gemma4ForConditionalGeneration  # noqa: E402
from transformers.models.gemma4 import modeling_gemma4 as mg  # noqa: E402

torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)

MODELS = ["e2b_like", "e4b_like", "31b_like", "26b_like", "plain", "legacy_keys", "ple_wide"]
FULL_MODELS = {"e2b_like"}
FULL_MAX = 1024
NPROJ = 8
S = 24
LABEL_IGNORED = (3, 9, 17)   # label positions set to -100 (position 0's label is shifted out anyway)
PAD_AT = 11                  # input_ids[PAD_AT] = 0, the pad id
FD_H = 1e-5
FD_PER_TENSOR = 2
QMAX = 32767                 # gradq: int16 steps per max |g|


def quantize(g, m):
    """round(g / m * QMAX) as int16, m = max |g| (the float32 gstat[1]); checks the bound"""
    g64 = g.detach().double()
    assert m == float(g64.abs().max()) and m > 0, (m, float(g64.abs().max()))
    q = torch.round(g64 / m * QMAX)
    assert float(q.abs().max()) == QMAX
    err = float((q * (m / QMAX) - g64).abs().max())
    assert err <= 0.5 * m / QMAX * (1 + 1e-9), (err, m)
    return q.to(torch.int16).contiguous()


def splitmix64(x):
    """numpy uint64 splitmix64 finaliser (wrapping arithmetic), as g4__splitmix64 in gemma4.h."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def sign_vector(j, n):
    """r_j[i] = +1 if the top bit of splitmix64(i + (j+1) * 2^32) is 0, else -1 (i < 2^32)."""
    i = np.arange(n, dtype=np.uint64) + (np.uint64(j + 1) << np.uint64(32))
    return np.where((splitmix64(i) >> np.uint64(63)) == 0, 1.0, -1.0)


def gstat(g):
    g = g.detach().double().reshape(-1).numpy()
    out = [float(np.sum(g * g)), float(np.max(np.abs(g)))]
    for j in range(NPROJ):
        out.append(float(np.dot(g, sign_vector(j, g.size))))
    return torch.tensor(out, dtype=torch.float32)  # computed in float64, stored as F32


class true_float64:
    """Inside this context a float64 model computes in float64 throughout: transformers casts
    to float32 in Gemma4RMSNorm (hidden_states.float()), in the attention and router softmax
    (dtype=torch.float32) and in the loss (logits.float()); that float32 noise (~1e-7 of the
    loss) would swamp a finite difference. RoPE's cos/sin stay float32 values (a function of
    the position only, as in gemma4.h), so the function differentiated is the float32 one's.
    norms: the RMSNorm classes to patch (default Gemma4RMSNorm; the 12B unified model has its own)."""

    def __init__(self, *norms):
        self.norms = norms or (mg.Gemma4RMSNorm,)

    def __enter__(self):
        self.norm_fwds, self.softmax = [c.forward for c in self.norms], torch.nn.functional.softmax
        softmax = self.softmax

        def norm_fwd(mod, x):
            y = x * torch.pow(x.pow(2).mean(-1, keepdim=True) + mod.eps, -0.5)
            return y * mod.weight if mod.with_scale else y

        def softmax64(x, dim=None, _stacklevel=3, dtype=None):
            if x.dtype == torch.float64:
                dtype = torch.float64
            return softmax(x, dim=dim, dtype=dtype)

        for c in self.norms:
            c.forward = norm_fwd
        torch.nn.functional.softmax = softmax64
        return self

    def __exit__(self, *exc):
        for c, f in zip(self.norms, self.norm_fwds):
            c.forward = f
        torch.nn.functional.softmax = self.softmax
        return False


def causal_lm_loss(logits, labels):
    """ForCausalLMLoss in the logits' own dtype: labels shifted left, -100 ignored, mean."""
    sl = torch.cat([labels[1:], torch.tensor([-100])])
    keep_rows = sl != -100
    return torch.nn.functional.cross_entropy(logits[keep_rows], sl[keep_rows], reduction="mean")


def text_model_of(model):
    """the decoder: model.model, or its language_model in the multimodal classes (the 12B unified one too)"""
    return getattr(model.model, "language_model", model.model)


def load(path, dtype, attn="eager"):
    with open(os.path.join(path, "config.json")) as f:
        wrapper = '"text_config"' in f.read()
    cls = Gemma4ForConditionalGeneration if wrapper else Gemma4ForCausalLM
    if attn == "sdpa" and wrapper:
        attn = {"": "sdpa", "text_config": "sdpa", "vision_config": "sdpa", "audio_config": "eager"}
    m = cls.from_pretrained(path, dtype=dtype, attn_implementation=attn, experts_implementation="eager")
    m.eval()
    return m


def checkpoint_keys(path):
    keys = set()
    for fn in os.listdir(path):
        if fn.endswith(".safetensors") and fn.startswith("model"):
            with safe_open(os.path.join(path, fn), "pt") as f:
                keys.update(f.keys())
    return keys


def sequence(name):
    g = torch.Generator().manual_seed(7000 + MODELS.index(name))
    ids = torch.randint(3, 512, (S,), generator=g, dtype=torch.int64)
    ids[0] = 2
    ids[PAD_AT] = 0
    ids[15] = ids[5]  # a repeated token: its embedding rows get two contributions
    labels = ids.clone()
    for p in LABEL_IGNORED:
        labels[p] = -100
    return ids, labels


def run(model, ids, labels, taps=False):
    """loss, {param name: grad}, and (if taps) the activation gradients."""
    model.zero_grad(set_to_none=True)
    tm = text_model_of(model)
    saved = {}
    hooks = []
    if taps:
        def keep(key):
            def hook(_m, _inp, out):
                h = out[0] if isinstance(out, (tuple, list)) else out
                h.retain_grad()
                saved[key] = h
            return hook
        hooks.append(tm.embed_tokens.register_forward_hook(keep("grad.embed_tokens")))
        for i, layer in enumerate(tm.layers):
            hooks.append(layer.register_forward_hook(keep(f"grad.layers.{i}")))
    f64 = next(model.parameters()).dtype == torch.float64
    try:
        out = model(input_ids=ids[None], labels=labels[None], use_cache=False)
        # the loss exactly as ForCausalLMLoss defines it, recomputed by hand (in float64 for
        # the float64 model: transformers' own casts the logits to float32)
        manual = causal_lm_loss(out.logits[0], labels)
        assert abs(float(manual) - float(out.loss)) < 1e-5 * max(1.0, abs(float(manual))), (float(manual), float(out.loss))
        loss = manual if f64 else out.loss
        loss.backward()
    finally:
        for h in hooks:
            h.remove()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    acts = {k: v.grad[0].detach().float().clone() for k, v in saved.items()}
    return loss.detach(), grads, acts


def routing(model, ids):
    """every MoE layer's top-k expert choice (empty for dense models)"""
    tm = text_model_of(model)
    got = []
    hooks = [l.router.register_forward_hook(lambda _m, _i, o: got.append(o[2].tolist()))
             for l in tm.layers if getattr(l, "enable_moe_block", False)]
    try:
        with torch.no_grad():
            model(input_ids=ids[None], use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return got


def fd_check(model64, name, flat_idx, ids, labels):
    """central difference of the float64 loss in one element"""
    p = dict(model64.named_parameters())[name]
    with torch.no_grad():
        flat = p.view(-1)
        old = float(flat[flat_idx])
        flat[flat_idx] = old + FD_H
        lp = float(causal_lm_loss(model64(input_ids=ids[None], use_cache=False).logits[0], labels))
        rp = routing(model64, ids)
        flat[flat_idx] = old - FD_H
        lm = float(causal_lm_loss(model64(input_ids=ids[None], use_cache=False).logits[0], labels))
        rm = routing(model64, ids)
        flat[flat_idx] = old
    assert rp == rm == routing(model64, ids), f"{name}[{flat_idx}]: the MoE top-k choice changed within +-h"
    return (lp - lm) / (2 * FD_H)


def fd_targets(names, grads):
    """a few parameters per model: the embedding, PLE table and projection, every owner's k_proj
    that readers read, a reader's q_proj, norms, router, experts"""
    picks = []
    for n in names:
        leaf = n.split("layers.")[-1]
        want = ("embed_tokens" in n or "per_layer_model_projection" in n or n.endswith(".norm.weight")
                or ("router" in n or "experts" in n) and "layers.1." in n
                or leaf.startswith(("0.", "1.", "2.")) and ("k_proj" in n or "v_proj" in n)
                or "q_proj" in n and leaf.split(".")[0] in ("3", "4", "7", "9", "11")
                or "layers.1.post_feedforward_layernorm" in n)
        if want:
            picks.append(n)
    out = {}
    for n in picks:
        g = grads[n].reshape(-1).abs()
        top = torch.topk(g, FD_PER_TENSOR).indices.tolist()
        out[n] = top
    return out


def make_one(name, root):
    path = os.path.join(root, name)
    ids, labels = sequence(name)
    keys = checkpoint_keys(path)

    m32 = load(path, torch.float32)
    loss, grads, acts = run(m32, ids, labels, taps=True)
    tm = text_model_of(m32)
    prefix = "model.language_model." if isinstance(m32, Gemma4ForConditionalGeneration) else "model."

    def ckpt(n):
        assert n in keys, f"{name}: parameter {n} is not a checkpoint tensor"
        return n

    # the gradient set: every parameter with a gradient (all text-model parameters), nothing else
    text_params = {prefix + n for n, _ in tm.named_parameters()}
    assert set(grads) == text_params, (sorted(set(grads) ^ text_params))[:10]
    for n, g in grads.items():
        assert torch.isfinite(g).all(), n
    # no gradient for a reader's stale k_proj/v_proj/k_norm: they are not modules at all
    assert not any(f"layers.{i}.self_attn.k_proj" in n for n in grads
                   for i in range(tm.first_kv_shared_layer_idx, len(tm.layers)))

    # torch's own sdpa path against eager, for the tolerance statement
    msd = load(path, torch.float32, attn="sdpa")
    loss_sdpa, grads_sdpa, _ = run(msd, ids, labels)
    sdpa_rel = max(float((grads_sdpa[n] - g).abs().max()) / max(float(g.abs().max()), 1e-30) for n, g in grads.items())
    print(f"{name}: loss {float(loss):.7f}  |sdpa - eager| loss {abs(float(loss_sdpa - loss)):.3g}  "
          f"max over tensors of max|dg|/max|g| {sdpa_rel:.3g}")

    m64 = load(path, torch.float64)
    f64ctx = true_float64().__enter__()
    loss64, grads64, _ = run(m64, ids, labels)
    f64_rel = max(float((grads64[n].float() - g).abs().max()) / max(float(g.abs().max()), 1e-30) for n, g in grads.items())
    print(f"{name}: float64 vs float32 autograd: max over tensors of max|dg|/max|g| {f64_rel:.3g}")

    out = {"input_ids": ids.to(torch.int32), "labels": labels.to(torch.int32),
           "loss": loss.reshape(1).float(), "loss64": loss64.reshape(1).float()}
    for n, g in sorted(grads.items()):
        out["gstat." + ckpt(n)] = gstat(g)
        if name in FULL_MODELS or g.numel() <= FULL_MAX:
            rows = torch.nonzero(g.reshape(g.shape[0], -1).abs().amax(dim=1)).reshape(-1) if g.dim() == 2 else None
            if rows is not None and g.numel() > FULL_MAX and 2 * rows.numel() < g.shape[0]:
                # mostly zero rows (the PLE table: only the sequence's ids have a gradient): the
                # nonzero rows and their indices, every other row exactly 0 (the same check)
                out["grad." + n] = g[rows].float().contiguous()
                out["grad_rows." + n] = rows.to(torch.int32).contiguous()
            elif g.numel() > FULL_MAX:  # FULL_MODELS: int16 against the tensor's own max
                out["gradq." + n] = quantize(g, float(out["gstat." + n][1]))
            else:
                out["grad." + n] = g.float().contiguous()
    if name in FULL_MODELS:  # the activation gradients: only where a test reads them (CLI compare)
        for k, v in acts.items():
            out[k] = v.contiguous()

    worst_fd = 0.0
    for n, idx in sorted(fd_targets(sorted(grads), grads).items()):
        rows = []
        for i in idx:
            d = fd_check(m64, n, i, ids, labels)
            rows.append([float(i), d])
            g32 = float(grads64[n].reshape(-1)[i])
            scale = float(grads[n].abs().max())
            worst_fd = max(worst_fd, abs(d - g32) / scale)
        out["fd." + n] = torch.tensor(rows, dtype=torch.float32)
    f64ctx.__exit__(None, None, None)
    print(f"{name}: {sum(1 for k in out if k.startswith('fd.'))} tensors finite-differenced; "
          f"max |fd - autograd64| / max|g| {worst_fd:.3g}")

    dst = os.path.join(path, "grad_golden.safetensors")
    save_file(out, dst)
    size = os.path.getsize(dst)
    print(f"{name}: wrote {dst} ({size} bytes, {len(grads)} gradients)")
    return dict(name=name, loss=float(loss), sdpa=sdpa_rel, f64=f64_rel, fd=worst_fd, size=size, n=len(grads))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default="data/tiny")
    ap.add_argument("--only", nargs="*")
    args = ap.parse_args()
    summary = [make_one(n, args.root) for n in MODELS if not args.only or n in args.only]
    vpath = os.path.join(args.root, "GRAD_VERSIONS.txt")
    kept = kept_model_lines(vpath, args.only, {s["name"] for s in summary})
    with open(vpath, "w") as f:
        f.write(versions_header())
        f.write(f"grads float32 CPU, eval(), attn_implementation=eager, experts_implementation=eager, "
                f"torch.set_num_threads(1); S {S}, labels -100 at {list(LABEL_IGNORED)}, pad id 0 at {PAD_AT}; "
                f"full gradients for {sorted(FULL_MODELS)} (int16 gradq above {FULL_MAX} elements) and tensors <= {FULL_MAX} elements, "
                f"{NPROJ} sign projections for all; finite differences in float64, h {FD_H}\n")
        f.write("columns: sdpa_rel = max over tensors of max|g_sdpa - g_eager| / max|g_eager| (torch's own spread); "
                "f64_rel = the same for float64 vs float32 autograd; fd_rel = max |fd64 - autograd64| / max|g| (checks the FD itself)\n")
        for line in kept:
            f.write(line)
        for s in summary:
            f.write(f"model {s['name']:12s} loss {s['loss']:.7f}  grads {s['n']:3d}  sdpa_rel {s['sdpa']:.3g}  "
                    f"f64_rel {s['f64']:.3g}  fd_rel {s['fd']:.3g}  bytes {s['size']}\n")


if __name__ == "__main__":
    main()
