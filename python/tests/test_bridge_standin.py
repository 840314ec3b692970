"""The torch bridge's logic (gemma4/_bridge.py) without torch, on a stand-in module
tree: plain Python objects named as a wrapped transformers Gemma 4 would be
("module." outside, FSDP's "_fsdp_wrapped_module" inside every layer, PEFT's
base_layer / lora_A.default), whose "forward" replays gemma4.h's own taps through
the forward hooks. The bridge must find every tap module under those names, agree
with the reference when nothing is wrong (max rel 0), name the planted faults
(a layer's attention output, one adapter gradient, a missing gradient), and
remove its hooks. make test-python-torch runs the same logic on real models."""

import numpy as np
import pytest

import gemma4
from conftest import golden, tiny
from gemma4 import _bridge


class Param:
    def __init__(self, grad=None, requires_grad=True):
        self.grad, self.requires_grad = grad, requires_grad


class Handle:
    def __init__(self, lst, fn):
        self.lst, self.fn = lst, fn

    def remove(self):
        self.lst.remove(self.fn)


class Mod:
    """named_modules / named_parameters / forward (pre-)hooks, as torch.nn.Module has them."""

    def __init__(self, **children):
        self.children, self.params, self.hooks, self.pre_hooks = dict(children), {}, [], []

    def named_modules(self, prefix=""):
        yield prefix, self
        for k, c in self.children.items():
            yield from c.named_modules(prefix + "." + k if prefix else k)

    def named_parameters(self, prefix=""):
        for name, mod in self.named_modules(prefix):
            for k, p in mod.params.items():
                yield (name + "." + k if name else k), p

    def register_forward_hook(self, fn):
        self.hooks.append(fn)
        return Handle(self.hooks, fn)

    def register_forward_pre_hook(self, fn):
        self.pre_hooks.append(fn)
        return Handle(self.pre_hooks, fn)

    def call(self, inp, out):
        for h in self.pre_hooks:
            h(self, (inp,))
        for h in self.hooks:
            h(self, (inp,), out)


class Gemma4TextModel(Mod):
    """Found by its class name, as the real one."""

    def project_per_layer_inputs(self, x):
        return x


def standin(m, taps, fault=None):
    """A tree for model m whose forward replays taps (gemma4.h's), + fault[name] added."""
    L = m.config["num_hidden_layers"]
    names = set(taps)
    layers = {}
    for i in range(L):
        sub = {n: Mod(base_layer=Mod()) if n in ("per_layer_input_gate", "per_layer_projection") else Mod()
               for n in _bridge.LAYER_TAPS if f"layers.{i}.{n}" in names}
        layers[str(i)] = Mod(_fsdp_wrapped_module=Mod(**sub))
    text = Gemma4TextModel(embed_tokens=Mod(), layers=Mod(**layers), norm=Mod())
    root = Mod(module=Mod(model=text, lm_head=Mod()))

    def forward():
        mods = dict(text.named_modules())
        for name, value in taps.items():
            v = value + (fault or {}).get(name, 0)
            if name == "per_layer_inputs":
                text.project_per_layer_inputs(v)
                continue
            if name.endswith(":input") or name == "logits" or name.split(".")[-1] in ("q", "k", "v"):
                continue  # the pre-hook's input is fed below; q/k/v come from the attention patch (torch only)
            path = name if not name.startswith("layers.") else name.replace(
                f"layers.{name.split('.')[1]}", f"layers.{name.split('.')[1]}._fsdp_wrapped_module", 1)
            inp = taps.get(name + ":input", v) if name.endswith("pre_feedforward_layernorm") else v
            if name.endswith("pre_feedforward_layernorm"):
                inp = inp + (fault or {}).get(name + ":input", 0)
            mods[path].call(inp[None], v[None])  # [1, S, cols], as transformers' outputs
    return root, text, forward


@pytest.fixture(scope="module")
def ref():
    m = gemma4.Model(tiny("e2b_like"), threads=1)
    ids = golden("e2b_like")["input_ids"][:12]
    return m, ids, m.taps(ids)


def run_bridge(text, forward, S):
    store = {}
    remove = _bridge.attach(text, S, np.asarray, store)
    forward()
    remove()
    assert all(not mod.hooks and not mod.pre_hooks for _, mod in text.named_modules()), "hooks left behind"
    assert "project_per_layer_inputs" not in text.__dict__, "the patch left behind"
    return store


def test_names():
    c = _bridge.canonical
    assert c("layers.3._fsdp_wrapped_module.self_attn.q_proj.base_layer.weight") == "layers.3.self_attn.q_proj.weight"
    assert c("layers.3.self_attn.q_proj.lora_A.default.weight") == "layers.3.self_attn.q_proj.lora_A.weight"
    assert c("layers.3._checkpoint_wrapped_module._orig_mod.mlp") == "layers.3.mlp"
    assert _bridge.reference_key("base_model.model.model.layers.1.mlp.up_proj.lora_B.weight", "model.") == \
        "layers.1.mlp.up_proj.lora_B.weight"
    assert _bridge.reference_key("model.language_model.norm.weight", "model.language_model.") == "norm.weight"


def test_forward_agrees_and_names_the_planted_layer(ref):
    m, ids, taps = ref
    S = len(ids)
    root, text, forward = standin(m, taps)
    name, found = _bridge.find_text_model(root)
    assert name == "module.model" and found is text
    mods = _bridge.tap_modules(text)
    assert "layers.3.self_attn" in mods and "layers.3.per_layer_input_gate" in mods
    assert mods["layers.3.per_layer_input_gate"] is text.children["layers"].children["3"].children[
        "_fsdp_wrapped_module"].children["per_layer_input_gate"], "the LoRA module, not its base_layer"
    got = run_bridge(text, forward, S)
    r = _bridge.compare_taps(taps, got, 1e-4)
    assert r.ok and r.first is None
    compared = [row for row in r.rows if row["status"] == "ok"]
    assert len(compared) >= 100 and all(row["max_rel"] == 0 for row in compared)
    skipped = {row["name"] for row in r.rows if row["status"] == "skipped"}
    assert skipped == {n for n in taps if n.split(".")[-1] in ("q", "k", "v") or n == "logits"}
    # a fault in layer 3's attention output (and what follows from it)
    fault = {n: 0.5 for n in list(taps)[list(taps).index("layers.3.self_attn"):]}
    root, text, forward = standin(m, taps, fault)
    r = _bridge.compare_taps(taps, run_bridge(text, forward, S), 1e-4)
    assert r.first == "layers.3.self_attn" and r.layer == 3
    assert "<== first over tolerance" in str(r) and str(r).splitlines()[-1].endswith("first: layers.3.self_attn")


def test_grads_agree_and_name_the_planted_tensor():
    m = gemma4.Model(tiny("e2b_like"), adapter=tiny("../lora/e2b_all"), threads=1)
    ids = golden("e2b_like")["input_ids"][:12]
    loss, grads = m.loss_and_grad(ids)
    # the user's tree: PEFT names inside FSDP-like wrappers, grads = the reference's
    text = Gemma4TextModel()
    for k, g in grads.items():
        key = _bridge.reference_key(k, m.prefix)  # e.g. layers.N.self_attn.q_proj.lora_A.weight
        path, which = key.split(".")[:-2], key.split(".")[-2]
        if path[0] == "layers":  # layers.N._fsdp_wrapped_module....
            path = path[:2] + ["_fsdp_wrapped_module"] + path[2:]
        mod = text
        for p in path:
            mod = mod.children.setdefault(p, Mod())
        mod.children.setdefault("base_layer", Mod()).params["weight"] = Param(None, requires_grad=False)
        mod.children.setdefault(which, Mod()).children.setdefault("default", Mod()).params["weight"] = Param(g.copy())
    root = Mod(base_model=Mod(model=Mod(model=text)))
    tname, t = _bridge.find_text_model(root)
    got = _bridge.user_grads(root, t, tname, np.asarray)
    assert len(got) == len(grads)
    r = _bridge.compare_grad_dicts(grads, m.prefix, got, 1e-3)
    assert r.ok and len(r.rows) == len(grads) and all(row["max_rel"] == 0 for row in r.rows)
    # backward order: the reverse of the checkpoint walk's
    assert [row["name"] for row in r.rows] == list(reversed(list(grads)))
    k = "base_model.model.model.layers.4.mlp.down_proj.lora_B.weight"
    bad = dict(got)
    key = _bridge.reference_key(k, m.prefix)
    bad[key] = got[key].copy()
    bad[key].reshape(-1)[3] += 0.01 * np.abs(bad[key]).max()
    r = _bridge.compare_grad_dicts(grads, m.prefix, bad, 1e-3)
    assert r.first == k and r.layer == 4
    bad[key] = None  # no .grad at all (a dropped path)
    r = _bridge.compare_grad_dicts(grads, m.prefix, bad, 1e-3)
    assert r.first == k and r.rows[[row["name"] for row in r.rows].index(k)]["status"] == "missing"
