"""The torch bridge's logic, without torch: which module of a user's model is which
tap, which parameter is which checkpoint tensor, and the first one that differs.

gemma4.torch drives it with a real torch model; python/tests/test_bridge_standin.py
drives it with a stand-in module tree (plain Python objects with the few methods
used here: named_modules, named_parameters, register_forward_hook,
register_forward_pre_hook), so CI checks this logic without torch.

Names. A module or parameter name is reduced to its *canonical* form, the name
under the text model as the checkpoint and gemma4.h's taps spell it:
  - everything up to and including the text model (found by class name
    Gemma4TextModel) goes: "module.", "base_model.model.", "model.language_model."
    and any other wrapper prefix;
  - wrapper components inside go: every component that starts with "_"
    (FSDP's _fsdp_wrapped_module, checkpoint_wrapper's _checkpoint_wrapped_module,
    torch.compile's _orig_mod); no Gemma module name starts with "_";
  - PEFT's: "q_proj.base_layer.weight" is "q_proj.weight"; "q_proj.lora_A.default.weight"
    is "q_proj.lora_A.weight" (the adapter's name dropped, as adapter_model.safetensors
    spells it).
"""

import re

import numpy as np

TEXT_MODEL_CLASS = "Gemma4TextModel"

# module paths (canonical, under the text model) whose output is a tap of the same name
LAYER_TAPS = ("input_layernorm", "self_attn", "post_attention_layernorm", "pre_feedforward_layernorm", "mlp",
              "post_feedforward_layernorm_1", "pre_feedforward_layernorm_2", "experts",
              "post_feedforward_layernorm_2", "per_layer_input_gate", "per_layer_projection",
              "post_per_layer_input_norm", "post_feedforward_layernorm")
_TAP_RE = re.compile(r"^(embed_tokens|norm|layers\.\d+|layers\.\d+\.(" + "|".join(LAYER_TAPS) + r"))$")
_PEFT_PART = re.compile(r"^(lora_A|lora_B|lora_embedding_A|lora_embedding_B|lora_dropout|lora_magnitude_vector)$")


def canonical(name):
    """A module or parameter name under the text model, wrappers and PEFT's adapter names removed."""
    parts = [p for p in name.split(".") if p and not p.startswith("_")]
    out = []
    i = 0
    while i < len(parts):
        p = parts[i]
        if p == "base_layer":  # PEFT: the wrapped nn.Linear's own weight
            i += 1
            continue
        out.append(p)
        if _PEFT_PART.match(p) and i + 1 < len(parts) and parts[i + 1] not in ("weight", "bias"):
            i += 2  # lora_A.<adapter name>.weight -> lora_A.weight
            continue
        i += 1
    return ".".join(out)


def find_text_model(root):
    """(its full name, the module): the first module whose class is Gemma4TextModel."""
    for name, mod in root.named_modules():
        if type(mod).__name__ == TEXT_MODEL_CLASS:
            return name, mod
    raise ValueError(f"gemma4: no {TEXT_MODEL_CLASS} inside this model (is it a Gemma 4 model?)")


def tap_modules(text):
    """{tap name: module} for the modules of the text model that are taps; when wrappers
    make several modules share a canonical name, the innermost (the real module) wins;
    PEFT's base_layer is never one (the LoRA module around it is)."""
    found = {}
    for name, mod in text.named_modules():
        if "base_layer" in name.split("."):
            continue  # PEFT's wrapped nn.Linear: its output lacks the adapter's part; the LoRA module is the tap
        c = canonical(name)
        if _TAP_RE.match(c):
            depth = name.count(".")
            if c not in found or depth > found[c][0]:
                found[c] = (depth, mod)
    return {k: v[1] for k, v in found.items()}


def rows(a, S):
    """[1, S, ...] or [S, ...] -> float32 [S, cols]."""
    a = np.asarray(a, dtype=np.float32)
    if a.ndim >= 2 and a.shape[0] == 1 and a.shape[1] == S:
        a = a[0]
    return np.ascontiguousarray(a.reshape(S, -1))


def attach(text, S, to_numpy, store):
    """Registers forward hooks that write every tap the model computes into store
    ({tap name: float32 [S, cols]}, in the order they fire). Returns a function that
    removes them (and undoes the per_layer_inputs patch)."""
    handles = []

    def out_hook(name):
        def hook(_mod, _inp, out):
            t = out[0] if isinstance(out, tuple) else out
            store[name] = rows(to_numpy(t), S)
        return hook

    def in_hook(name):
        def hook(_mod, inp):
            store[name] = rows(to_numpy(inp[0]), S)
        return hook

    mods = tap_modules(text)
    for name, mod in mods.items():
        if name.endswith(".pre_feedforward_layernorm"):
            handles.append(mod.register_forward_pre_hook(in_hook(name + ":input")))
        handles.append(mod.register_forward_hook(out_hook(name)))
    orig = text.__dict__.get("project_per_layer_inputs")
    if hasattr(text, "project_per_layer_inputs"):
        bound = text.project_per_layer_inputs

        def project(*a, **k):
            out = bound(*a, **k)
            store["per_layer_inputs"] = rows(to_numpy(out), S)
            return out
        text.project_per_layer_inputs = project

    def remove():
        for h in handles:
            h.remove()
        if hasattr(text, "project_per_layer_inputs"):
            if orig is None:
                del text.project_per_layer_inputs
            else:
                text.project_per_layer_inputs = orig
    return remove


def _rel(got, ref):
    d = np.abs(got.astype(np.float64) - ref.astype(np.float64))
    mx = float(np.abs(ref).max()) if ref.size else 0.0
    dmax = float(d.max()) if d.size else 0.0
    if np.isnan(d).any():
        dmax = float("inf")
    return dmax, (dmax / mx if mx > 0 else dmax)


class Report:
    """The comparison, row by row in order: .rows (dicts: name, shape, max_abs, max_rel,
    status), .first (the first name over tolerance, or None), .ok, .layer (the decoder
    layer of .first, or None); str() prints the table as `gemma4 compare` does."""

    def __init__(self, kind, tolerance):
        self.kind, self.tolerance, self.rows, self.first = kind, tolerance, [], None

    @property
    def ok(self):
        return self.first is None

    @property
    def layer(self):
        m = re.search(r"layers\.(\d+)", self.first or "")
        return int(m.group(1)) if m else None

    def add(self, name, shape, max_abs=None, max_rel=None, status="ok"):
        bad = status in ("over", "missing", "shape")
        if bad and self.first is None:
            self.first = name
        self.rows.append(dict(name=name, shape=shape, max_abs=max_abs, max_rel=max_rel, status=status))

    def compare(self, name, ref, got):
        """One row: got's shape differs from ref's, or got's difference from ref, against the tolerance."""
        if got.shape != ref.shape:
            self.add(name, got.shape, status="shape")
            return
        d, rel = _rel(got, ref)
        self.add(name, ref.shape, d, rel, "ok" if rel <= self.tolerance else "over")

    def __str__(self):
        w = max([48] + [len(r["name"]) + 1 for r in self.rows])
        out = [f"{self.kind:<{w}} {'shape':<14} {'max abs':>12} {'max rel':>12}"]
        first_seen, over, compared = False, 0, 0
        for r in self.rows:
            shape = "x".join(str(s) for s in r["shape"]) if r["shape"] else "-"
            if r["status"] == "skipped":
                out.append(f"{r['name']:<{w}} {shape:<14} {'-':>12} {'-':>12}  ({r.get('why', 'not compared')})")
                continue
            mark = ""
            if r["status"] != "ok":
                over += 1
                mark = ("  <== first " + ("over tolerance" if r["status"] == "over" else r["status"])
                        if not first_seen else "  " + r["status"])
                first_seen = True
            if r["status"] in ("ok", "over"):
                compared += 1
                out.append(f"{r['name']:<{w}} {shape:<14} {r['max_abs']:>12.3g} {r['max_rel']:>12.3g}{mark}")
            else:
                out.append(f"{r['name']:<{w}} {shape:<14} {'-':>12} {'-':>12}{mark}")
        out.append(f"{compared} {self.kind}s compared, {over} over tolerance {self.tolerance:g}"
                   + (f"; first: {self.first}" if self.first else ""))
        return "\n".join(out)

    __repr__ = __str__


def compare_taps(ref, got, tolerance):
    """Every tap of ref (gemma4.h's, in forward order) against got (the user's model's)."""
    rep = Report("tap", tolerance)
    for name, r in ref.items():
        g = got.get(name)
        if g is None:
            rep.add(name, r.shape, status="skipped")
            rep.rows[-1]["why"] = "not captured from the model"
            continue
        rep.compare(name, r, g)
    return rep


def reference_key(name, prefix):
    """A gemma4.h gradient name -> its canonical name (under the text model), or lm_head.weight."""
    for p in ("base_model.model." + prefix, prefix, "base_model.model."):
        if name.startswith(p):
            return name[len(p):]
    return name


def user_grads(root, text, text_name, to_numpy):
    """{canonical name: gradient ndarray or None} of every parameter of the user's model:
    the text model's, plus lm_head's (outside it)."""
    out = {}
    for name, p in text.named_parameters():
        if getattr(p, "requires_grad", True):
            out[canonical(name)] = None if p.grad is None else to_numpy(p.grad)
    for name, p in root.named_parameters():
        if text_name and (name == text_name or name.startswith(text_name + ".")):
            continue
        c = canonical(name).split(".")
        if "lm_head" in c and getattr(p, "requires_grad", True):
            out[".".join(c[c.index("lm_head"):])] = None if p.grad is None else to_numpy(p.grad)
    return out


def compare_grad_dicts(ref, ref_prefix, got, tolerance):
    """ref: gemma4.h's {checkpoint name: gradient} (in checkpoint order); got: the user's
    {canonical name: gradient or None}. Rows in backward order (last layer first), as
    `gemma4 compare` reports gradients; a tensor the reference trains that has no .grad
    in the user's model is a difference ("missing")."""
    rep = Report("gradient", tolerance)
    for name in reversed(list(ref)):
        r = ref[name]
        key = reference_key(name, ref_prefix)
        if key not in got:
            rep.add(name, r.shape, status="skipped")
            rep.rows[-1]["why"] = "no such parameter in the model"
            continue
        g = got[key]
        if g is None:
            rep.add(name, r.shape, status="missing")
            continue
        g = np.asarray(g, np.float32).reshape(r.shape) if np.size(g) == r.size else np.asarray(g)
        rep.compare(name, r, g)
    return rep
