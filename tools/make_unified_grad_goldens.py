#!/usr/bin/env python3
"""Gradient golden for the 12B unified model's tiny stand-in (data/tiny/unified_like), from torch
autograd on transformers' Gemma4UnifiedForConditionalGeneration: the format of
tools/make_grad_goldens.py (gstat.* for every parameter with a gradient, grad.* for those with
<= FULL_MAX elements, fd.* float64 central differences, loss, loss64, input_ids, labels), written to

    data/tiny/unified_like/grad_golden.safetensors
    data/tiny/UNIFIED_GRAD_VERSIONS.txt     versions and the measured spreads
    data/lora/unified_all_linear/grad_golden.safetensors   the adapter's gradients (base frozen) through
        peft (PeftModel.from_pretrained on the float32 base, as tools/make_lora_goldens.py's cases):
        input_ids, labels (the same sequence), loss, grad.<name> F32 for every lora_A / lora_B, named
        as in adapter_model.safetensors; the three embedder modules' (embed_vision / embed_audio) are
        stored as zeros: with text tokens only autograd gives them no gradient (None), and g4_train,
        which lists them, must give exactly 0

Text tokens only (what g4_train takes): ids drawn from 3..499, below the multimodal special ids
(500-506), so the vision and audio embedders get no gradient and the gradient set is the text
decoder's (model.language_model.*; the tied lm_head under embed_tokens). A separate script so
that make_grad_goldens.py's seven goldens and GRAD_VERSIONS.txt stay byte-identical; the helpers
(gstat, sign vectors, loss) are imported from it.

Run from the repository root:
    venv/bin/python tools/make_unified_grad_goldens.py
"""

import os

import torch
from safetensors.torch import save_file

import make_grad_goldens as mgg  # tools/, beside this file: pins torch 2.15 / transformers 5.23.0
from make_goldens import versions_header

from transformers import Gemma4UnifiedForConditionalGeneration  # noqa: E402
from transformers.models.gemma4_unified import modeling_gemma4_unified as mu  # noqa: E402

NAME = "unified_like"
S, LABEL_IGNORED, PAD_AT, FULL_MAX, FD_H = mgg.S, mgg.LABEL_IGNORED, mgg.PAD_AT, mgg.FULL_MAX, mgg.FD_H
SEED = 7100


def sequence():
    g = torch.Generator().manual_seed(SEED)
    ids = torch.randint(3, 500, (S,), generator=g, dtype=torch.int64)  # no multimodal special ids
    ids[0] = 2
    ids[PAD_AT] = 0
    ids[15] = ids[5]
    labels = ids.clone()
    for p in LABEL_IGNORED:
        labels[p] = -100
    return ids, labels


def load(path, dtype, attn="eager"):
    if attn == "sdpa":
        attn = {"": "sdpa", "text_config": "sdpa", "vision_config": "sdpa", "audio_config": "eager"}
    m = Gemma4UnifiedForConditionalGeneration.from_pretrained(path, dtype=dtype, attn_implementation=attn)
    m.eval()
    return m


def lora_grads(root, out, ids, labels, dtype, attn="eager"):
    """loss and {name: grad} of the adapter's tensors, base frozen, through PeftModel.from_pretrained"""
    from peft import PeftModel
    model = PeftModel.from_pretrained(load(os.path.join(root, NAME), dtype, attn), out).eval()
    for n, p in model.named_parameters():
        if "lora_" in n:
            p.data = p.data.to(dtype)  # autocast_adapter_dtype keeps the adapter float32
        p.requires_grad_("lora_" in n)
    model.zero_grad()
    if dtype == torch.float64:
        with mgg.true_float64(mu.Gemma4UnifiedRMSNorm):
            loss = mgg.causal_lm_loss(model(input_ids=ids[None], use_cache=False).logits[0], labels)
            loss.backward()
    else:
        loss = model(input_ids=ids[None], labels=labels[None], use_cache=False).loss
        loss.backward()
    return loss, model


def make_lora(root, ids, labels, adapter="unified_all_linear"):
    """the adapter's gradients (float32, eager: the golden) and torch's own spread on them: sdpa vs
    eager and float64 vs float32 autograd, max over tensors of max|dg| / max|g|"""
    from safetensors.torch import load_file
    out = os.path.join(root, "..", "lora", adapter)
    ref = {}
    for key, dt, attn in (("sdpa", torch.float32, "sdpa"), ("f64", torch.float64, "eager")):
        _, m = lora_grads(root, out, ids, labels, dt, attn)
        ref[key] = {n: p.grad.detach().double() for n, p in m.named_parameters() if p.grad is not None}
    loss, model = lora_grads(root, out, ids, labels, torch.float32)
    g32 = {n: p.grad.detach().double() for n, p in model.named_parameters() if p.grad is not None}
    spread = {k: max(float((r[n] - g32[n]).abs().max() / r[n].abs().max()) for n in g32) for k, r in ref.items()}
    saved = load_file(os.path.join(out, "adapter_model.safetensors"))
    grads, zero = {}, 0
    for n, p in model.named_parameters():
        if "lora_" in n:
            key = n.replace(".default", "")
            assert key in saved, key
            if p.grad is None:
                assert ".embed_vision." in key or ".embed_audio." in key, key
                zero += 1
            g = torch.zeros_like(p) if p.grad is None else p.grad.detach()
            grads["grad." + key] = g.float().contiguous()
    assert set(k[5:] for k in grads) == set(saved), "gradients do not cover the adapter"
    dst = os.path.join(out, "grad_golden.safetensors")
    save_file({"input_ids": ids.to(torch.int32), "labels": labels.to(torch.int32),
               "loss": loss.detach().reshape(1).float(), **grads}, dst)
    size = os.path.getsize(dst)
    print(f"{adapter}: loss {float(loss):.7f}; {len(grads)} adapter gradients ({zero} zero: embedders); {size} bytes")
    return (f"adapter {adapter} (peft {__import__('peft').__version__}) loss {float(loss):.7f}  grads {len(grads)} "
            f"({zero} embedder tensors zero)  sdpa_rel {spread['sdpa']:.3g}  f64_rel {spread['f64']:.3g}  bytes {size}\n")


def main(root="data/tiny"):
    path = os.path.join(root, NAME)
    ids, labels = sequence()
    keys = mgg.checkpoint_keys(path)
    m32 = load(path, torch.float32)
    loss, grads, _ = mgg.run(m32, ids, labels)
    tm = m32.model.language_model
    prefix = "model.language_model."
    text_params = {prefix + n for n, _ in tm.named_parameters()}
    assert set(grads) == text_params, sorted(set(grads) ^ text_params)[:10]
    for n, g in grads.items():
        assert n in keys, f"{n} is not a checkpoint tensor"
        assert torch.isfinite(g).all(), n
    assert not any(f"layers.{i}.self_attn.k_proj" in n for n in grads
                   for i in range(tm.first_kv_shared_layer_idx, len(tm.layers)))

    msd = load(path, torch.float32, attn="sdpa")
    loss_sdpa, grads_sdpa, _ = mgg.run(msd, ids, labels)
    sdpa_rel = max(float((grads_sdpa[n] - g).abs().max()) / max(float(g.abs().max()), 1e-30) for n, g in grads.items())

    m64 = load(path, torch.float64)
    with mgg.true_float64(mu.Gemma4UnifiedRMSNorm):
        loss64, grads64, _ = mgg.run(m64, ids, labels)
        f64_rel = max(float((grads64[n].float() - g).abs().max()) / max(float(g.abs().max()), 1e-30) for n, g in grads.items())
        out = {"input_ids": ids.to(torch.int32), "labels": labels.to(torch.int32),
               "loss": loss.reshape(1).float(), "loss64": loss64.reshape(1).float()}
        for n, g in sorted(grads.items()):
            out["gstat." + n] = mgg.gstat(g)
            if g.numel() <= FULL_MAX:
                out["grad." + n] = g.float().contiguous()
        worst_fd = 0.0
        for n, idx in sorted(mgg.fd_targets(sorted(grads), grads).items()):
            rows = []
            for i in idx:
                d = mgg.fd_check(m64, n, i, ids, labels)
                rows.append([float(i), d])
                worst_fd = max(worst_fd, abs(d - float(grads64[n].reshape(-1)[i])) / float(grads[n].abs().max()))
            out["fd." + n] = torch.tensor(rows, dtype=torch.float32)
    n_fd = sum(1 for k in out if k.startswith("fd."))
    lora_line = make_lora(root, ids, labels)
    dst = os.path.join(path, "grad_golden.safetensors")
    save_file(out, dst)
    size = os.path.getsize(dst)
    print(f"{NAME}: loss {float(loss):.7f} (sdpa {float(loss_sdpa):.7f}, f64 {float(loss64):.7f}); {len(grads)} gradients, "
          f"{n_fd} finite-differenced; sdpa_rel {sdpa_rel:.3g} f64_rel {f64_rel:.3g} fd_rel {worst_fd:.3g}; {dst} {size} bytes")
    with open(os.path.join(root, "UNIFIED_GRAD_VERSIONS.txt"), "w") as f:
        f.write(versions_header())
        f.write(f"grads float32 CPU, eval(), Gemma4UnifiedForConditionalGeneration, attn_implementation=eager, "
                f"torch.set_num_threads(1); text tokens only (ids 3..499, seed {SEED}); S {S}, labels -100 at "
                f"{list(LABEL_IGNORED)}, pad id 0 at {PAD_AT}; full gradients for tensors <= {FULL_MAX} elements, "
                f"{mgg.NPROJ} sign projections for all; finite differences in float64, h {FD_H}\n")
        f.write("columns as data/tiny/GRAD_VERSIONS.txt: sdpa_rel (torch's sdpa vs eager), f64_rel (float64 vs float32 "
                "autograd), fd_rel (float64 FD vs float64 autograd), all max over tensors of max|dg| / max|g|\n")
        f.write(f"model {NAME:12s} loss {float(loss):.7f}  grads {len(grads):3d}  sdpa_rel {sdpa_rel:.3g}  "
                f"f64_rel {f64_rel:.3g}  fd_rel {worst_fd:.3g}  bytes {size}\n")
        f.write(lora_line)


if __name__ == "__main__":
    main()
