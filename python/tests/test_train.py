"""Model.loss_and_grad against torch autograd on transformers
(data/tiny/*/grad_golden.safetensors, tools/make_grad_goldens.py), checked as
tests/test_train.c's check_entry does: the loss within 1e-5 relative; per
tensor the sum of squares within 2 * GTOL, max |g| within GTOL, 8 sign
projections within GTOL * ||ref|| * sqrt(8), the full gradient (grad.*, or
only its nonzero rows grad_rows.*, or int16-quantized gradq.* plus its rounding
bound) within GTOL * max |ref|, and finite-difference points (fd.*); GTOL = 1e-4.
recompute=True gives the same bits."""

import numpy as np
import pytest

from conftest import golden

GTOL = 1e-4
GQ_MAX = 32767.0
GQ_ERR = 0.5 / GQ_MAX
GRAD_MODELS = ["e2b_like", "e4b_like", "31b_like", "26b_like", "legacy_keys", "plain", "ple_wide", "unified_like"]
M64 = (1 << 64) - 1


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def sign_vector(n, j):
    """+-1 per element: tools/make_grad_goldens.py's sign_vector (splitmix64's top bit)."""
    with np.errstate(over="ignore"):
        x = np.arange(n, dtype=np.uint64) + np.uint64((j + 1) << 32)
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return np.where(x >> np.uint64(63), -1.0, 1.0)


def worse(a, b):
    return np.inf if (a != a or b != b) else max(a, b)


def check_entry(g, name, ours):
    """The worst relative error of one gradient against the golden (test_train.c check_entry)."""
    ours = np.asarray(ours, np.float64).reshape(-1)
    stt = g.get("gstat." + name)
    if stt is None or stt.size != 10:
        return np.inf, False
    ss, mx = float(np.sum(ours * ours)), float(np.max(np.abs(ours))) if ours.size else 0.0
    norm = np.sqrt(float(stt[0]))
    w = 0.0
    w = worse(w, abs(ss - stt[0]) / max(stt[0], 1e-30) / 2)
    w = worse(w, abs(mx - stt[1]) / max(stt[1], 1e-30))
    for j in range(8):
        w = worse(w, abs(float(np.dot(sign_vector(ours.size, j), ours)) - stt[2 + j]) / max(norm * np.sqrt(8.0), 1e-30))
    full = False
    if "grad." + name in g:
        ref = g["grad." + name].astype(np.float64)
        if "grad_rows." + name in g:  # only the nonzero rows; every other row must be 0
            rows = g["grad_rows." + name]
            o2 = ours.reshape(-1, ref.shape[-1])
            dense = np.zeros_like(o2)
            dense[rows] = ref.reshape(len(rows), -1)
            d = np.abs(o2 - dense)
            w = worse(w, float(d.max()) / max(float(np.abs(ref).max()), 1e-30) if not np.isnan(d).any() else np.inf)
        else:
            d = np.abs(ours - ref.reshape(-1))
            w = worse(w, float(d.max()) / max(float(np.abs(ref).max()), 1e-30) if not np.isnan(d).any() else np.inf)
        full = True
    elif "gradq." + name in g:
        q = g["gradq." + name].astype(np.float64).reshape(-1)
        s = stt[1] / GQ_MAX
        d = np.abs(ours - q * s)
        w = worse(w, (float(d.max()) if not np.isnan(d).any() else np.inf) / stt[1] + GQ_ERR)
        full = True
    fd = g.get("fd." + name)
    if fd is not None:  # [k, 2]: (flat index, float64 finite difference) pairs
        fd = fd.reshape(-1)
        for at, v in zip(fd[0::2], fd[1::2]):
            if int(at) >= ours.size:
                return np.inf, full
            w = worse(w, abs(ours[int(at)] - float(v)) / max(float(stt[1]), 1e-30))
    return w, full


@pytest.mark.parametrize("name", GRAD_MODELS)
def test_loss_and_grads_match_torch_autograd(model, name):
    g = golden(name, "grad_golden.safetensors")
    m = model(name)
    loss, grads = m.loss_and_grad(g["input_ids"], labels=g["labels"])
    assert abs(loss - g["loss"][0]) <= 1e-5 * abs(g["loss"][0])
    want = sorted(k[6:] for k in g if k.startswith("gstat."))
    assert sorted(grads) == want, "the gradient set is transformers' trained parameters"
    bad, full = [], 0
    for k in reversed(list(grads)):  # backward order: the first divergence is named first
        w, f = check_entry(g, k, grads[k])
        full += f
        if not w <= GTOL:
            bad.append((k, w))
    assert not bad, f"{len(bad)} gradients off; first in backward order: {bad[0]}"
    assert full > 0
    # shapes are the checkpoint's
    emb = grads[m.prefix + "embed_tokens.weight"]
    assert emb.shape == (m.vocab_size, m.config["hidden_size"])


def test_recompute_and_labels(model):
    g = golden("e2b_like", "grad_golden.safetensors")
    m = model("e2b_like")
    ids, labels = g["input_ids"], g["labels"]
    l1, g1 = m.loss_and_grad(ids, labels)
    first = {k: v.copy() for k, v in g1.items()}  # the first call's values, in arrays of their own
    l2, g2 = m.loss_and_grad(ids, labels, recompute=True)
    assert l1 == l2 and all(np.array_equal(g1[k], g2[k]) for k in g1)
    # default labels are the ids; a -100 drops a row
    l3, _ = m.loss_and_grad(ids)
    lab = np.array(ids, np.int64)
    lab[5] = -100
    l4, _ = m.loss_and_grad(ids, lab)
    assert l3 != l4
    # the returned arrays are not overwritten by the later calls (the last drops a row: other gradients)
    assert all(np.array_equal(g1[k], first[k]) for k in g1)


def test_planted_gradient_error_is_caught(model):
    """The check is not vacuous: a 1e-3 relative change to one gradient fails it."""
    g = golden("e2b_like", "grad_golden.safetensors")
    loss, grads = model("e2b_like").loss_and_grad(g["input_ids"], labels=g["labels"])
    k = next(k for k in grads if "layers.3.self_attn.q_proj" in k)
    bad = grads[k].copy()
    bad.reshape(-1)[7] += 1e-3 * np.abs(bad).max()
    assert check_entry(g, k, grads[k])[0] <= GTOL
    assert check_entry(g, k, bad)[0] > GTOL
