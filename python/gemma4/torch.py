"""The bridge to your own transformers Gemma 4 model (imports torch: import it
only where torch is installed).

    import gemma4.torch as g4t
    report = g4t.compare_forward(model, input_ids)          # forward hooks on your modules vs gemma4.h's taps
    print(report); report.first                             # "layers.6.self_attn.k", or None when all agree
    loss = model(input_ids, labels=labels).loss; loss.backward()
    report = g4t.compare_grads(model, input_ids, labels)    # every p.grad vs gemma4.h's gradient
    report.first                                            # "model.layers.4.self_attn.k_proj.weight", or None

Both build the reference from the model's CURRENT weights (exported to a temporary
checkpoint, with a PEFT adapter as an adapter), unless reference= gives a
gemma4.Model or a checkpoint directory. They work on PEFT-wrapped models and on
models whose module names carry wrapper prefixes (DDP's module., FSDP's
_fsdp_wrapped_module, checkpoint_wrapper's, torch.compile's _orig_mod): see
gemma4/_bridge.py for the name rules.

Tolerances (relative to each reference tensor's max |value|): taps 1e-4 in
float32, 3e-2 when the model's weights are bfloat16 (`gemma4 compare`'s
defaults); gradients 1e-3 (torch's own float32 and float64 autograd differ by up
to 4.3e-5 on the test models; a deep model accumulates more; a wrong term shows
as 1e-2 or more).
"""

import json
import os
import sys
import tempfile

import numpy as np
import torch

from . import _bridge
from ._core import Model

TOL_F32 = 1e-4
TOL_BF16 = 3e-2
TOL_GRAD = 1e-3


def _np(t):
    return t.detach().to(torch.float32).cpu().numpy()


def _ids_tensor(input_ids):
    if torch.is_tensor(input_ids):
        input_ids = input_ids.detach().cpu().numpy()
    ids = torch.as_tensor(np.array(input_ids, dtype=np.int64))
    ids = ids.reshape(-1)
    if ids.dim() != 1:
        raise ValueError("input_ids: one sequence")
    return ids


def _peft_parts(root):
    """(is PEFT, active adapter name, its peft config)."""
    cfgs = getattr(root, "peft_config", None)
    if not cfgs:
        return False, None, None
    name = getattr(root, "active_adapter", None)
    if isinstance(name, (list, tuple)):
        name = name[0]
    return True, name, cfgs[name]


def export_checkpoint(hf_model, directory):
    """Writes the model's current text weights as a checkpoint gemma4.h loads
    (config.json: the text config; model.safetensors: model.<name> as stored), and a
    PEFT adapter (adapter/: adapter_config.json + adapter_model.safetensors). Returns
    (checkpoint dir, adapter dir or None, bf16: whether the weights are bfloat16)."""
    from safetensors.torch import save_file
    text_name, text = _bridge.find_text_model(hf_model)
    is_peft, adapter_name, pcfg = _peft_parts(hf_model)
    base, lora, ranks = {}, {}, {}
    dtypes = set()
    for name, t in text.state_dict(keep_vars=False).items():
        c = _bridge.canonical(name)
        if ".lora_A." in "." + c + "." or ".lora_B." in "." + c + ".":
            if is_peft and f".{adapter_name}." not in f".{name}.":
                continue  # another adapter's
            lora["base_model.model.model." + c] = t.detach().to(torch.float32).contiguous().cpu()
            continue
        if _bridge._PEFT_PART.match(c.split(".")[-2] if c.count(".") else ""):
            continue
        if c in base:
            continue
        dtypes.add(t.dtype)
        base["model." + c] = t.detach().contiguous().cpu()
    lm = [(n, m) for n, m in hf_model.named_modules() if _bridge.canonical(n).split(".")[-1:] == ["lm_head"]]
    tied = True
    if lm:
        lm_mod = lm[-1][1]
        w = getattr(lm_mod, "weight", None)
        if w is None and hasattr(lm_mod, "base_layer"):
            w = lm_mod.base_layer.weight
        emb = text.embed_tokens.weight
        tied = w is None or w.data_ptr() == emb.data_ptr()
        if not tied:
            base["lm_head.weight"] = w.detach().contiguous().cpu()
    bf16 = dtypes == {torch.bfloat16}
    if not bf16:
        base = {k: (v.to(torch.float32) if v.is_floating_point() and v.dtype not in (torch.float16, torch.bfloat16)
                    else v) for k, v in base.items()}
    os.makedirs(directory, exist_ok=True)
    cfg = text.config.to_dict()
    cfg["model_type"] = "gemma4_text"
    cfg["tie_word_embeddings"] = bool(tied)
    cfg.pop("architectures", None)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(cfg, f, default=str)
    save_file(base, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
    adapter_dir = None
    if is_peft and lora:
        adapter_dir = os.path.join(directory, "adapter")
        os.makedirs(adapter_dir, exist_ok=True)
        modules, rank_pattern, alpha_pattern = [], {}, {}
        for name, m in text.named_modules():
            r = getattr(m, "r", None)
            if isinstance(r, dict) and adapter_name in r:
                key = "model." + _bridge.canonical(name)
                modules.append(key)
                ranks[key] = (r[adapter_name], m.lora_alpha[adapter_name])
        r0, a0 = next(iter(ranks.values()))
        for key, (r, a) in ranks.items():
            if r != r0:
                rank_pattern["^" + key.replace(".", r"\.") + "$"] = r
            if a != a0:
                alpha_pattern["^" + key.replace(".", r"\.") + "$"] = a
        acfg = {"peft_type": "LORA", "r": r0, "lora_alpha": a0, "target_modules": modules,
                "use_rslora": bool(getattr(pcfg, "use_rslora", False)), "bias": "none",
                "rank_pattern": rank_pattern, "alpha_pattern": alpha_pattern, "lora_dropout": 0.0}
        with open(os.path.join(adapter_dir, "adapter_config.json"), "w") as f:
            json.dump(acfg, f)
        save_file(lora, os.path.join(adapter_dir, "adapter_model.safetensors"), metadata={"format": "pt"})
    return directory, adapter_dir, bf16


class _Reference:
    """A gemma4.Model for the comparison: the given one, one loaded from a directory, or
    one exported from the model's current weights (removed with the object)."""

    def __init__(self, hf_model, reference, bf16=None):
        self.tmp = None
        if isinstance(reference, Model):
            self.model = reference
            return
        if reference is not None:
            self.model = Model(reference, bf16=bool(bf16))
            return
        self.tmp = tempfile.TemporaryDirectory(prefix="gemma4_ref_")
        d, adapter, is_bf16 = export_checkpoint(hf_model, self.tmp.name)
        self.model = Model(d, adapter=adapter, bf16=is_bf16 if bf16 is None else bool(bf16))

    def close(self):
        if self.tmp is not None:
            self.model.close()
            self.tmp.cleanup()
            self.tmp = None


def _patch_attention(text, S, store):
    """q, k, v as attended (the attention function's arguments), through the modeling
    module's eager_attention_forward, as tools/hf_dump.py; effective when the model runs
    eager attention (otherwise these three taps are reported as not captured)."""
    mod = sys.modules.get(type(text).__module__)
    orig = getattr(mod, "eager_attention_forward", None)
    if orig is None:
        return lambda: None

    def eager(module, query, key, value, *a, **k):
        p = f"layers.{module.layer_idx}.self_attn."
        for name, t in (("q", query), ("k", key), ("v", value)):  # [1, heads, S, D] -> [S, heads*D]
            store[p + name] = _np(t[0].transpose(0, 1).reshape(S, -1))
        return orig(module, query, key, value, *a, **k)
    mod.eager_attention_forward = eager

    def undo():
        mod.eager_attention_forward = orig
    return undo


def model_taps(hf_model, input_ids):
    """{tap name: float32 [S, cols]} of the model's own forward (no cache, eval mode
    during the call), under gemma4.h's tap names, in the order they fire."""
    ids = _ids_tensor(input_ids)
    S = ids.numel()
    _, text = _bridge.find_text_model(hf_model)
    store = {}
    remove = _bridge.attach(text, S, _np, store)
    undo = _patch_attention(text, S, store)
    training = [(m, m.training) for m in hf_model.modules()]
    dev = next(hf_model.parameters()).device
    try:
        hf_model.eval()
        with torch.no_grad():
            out = hf_model(input_ids=ids.reshape(1, S).to(dev), use_cache=False)
        store["logits"] = _bridge.rows(_np(out.logits), S)
    finally:
        undo()
        remove()
        for m, t in training:
            m.training = t
    return store


def compare_forward(hf_model, input_ids, tolerance=None, reference=None):
    """Runs the model (forward hooks on the transformers modules that match gemma4.h's
    taps) and gemma4.h on input_ids; returns a Report naming the first tap over tolerance
    (report.first, report.layer; None when all agree). tolerance: default 1e-4, 3e-2 for a
    bfloat16 model. reference: a gemma4.Model or checkpoint directory (default: the
    model's current weights, exported)."""
    ids = _ids_tensor(input_ids)
    got = model_taps(hf_model, ids)
    ref = _Reference(hf_model, reference)
    try:
        tol = tolerance if tolerance is not None else (TOL_BF16 if ref.model.bf16 else TOL_F32)
        want = ref.model.taps(ids.numpy())
    finally:
        ref.close()
    return _bridge.compare_taps(want, got, tol)


def compare_grads(hf_model, input_ids, labels=None, tolerance=TOL_GRAD, reference=None):
    """After your own backward of model(input_ids, labels=labels).loss: every p.grad
    against gemma4.h's gradient of the same loss (labels default the ids; -100 ignored).
    Returns a Report in backward order naming the first tensor that differs (or has no
    gradient); report.loss is gemma4.h's loss. With a PEFT model, the adapter's
    gradients."""
    ids = _ids_tensor(input_ids)
    lab = None if labels is None else _ids_tensor(labels).numpy()
    root = hf_model
    text_name, text = _bridge.find_text_model(root)
    got = _bridge.user_grads(root, text, text_name, _np)
    ref = _Reference(hf_model, reference, bf16=False)
    try:
        loss, grads = ref.model.loss_and_grad(ids.numpy(), lab)
        rep = _bridge.compare_grad_dicts(grads, ref.model.prefix, got, tolerance)
    finally:
        ref.close()
    rep.loss = loss
    return rep
