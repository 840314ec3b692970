"""The worked example of docs/python.md: two planted shared-KV faults in a real
transformers Gemma 4, each named by one gemma4.torch call.

    venv/bin/python python/examples/planted_faults.py [DATA_DIR]     (with torch, transformers)

1. legacy_keys (a file that, like Google's releases, still carries k_proj/v_proj/k_norm
   for its KV-shared reader layers 3 and 4): reader layer 3 computes its own K/V from
   those stale tensors instead of reading layer 1's (what a loader that binds them and
   drops the sharing does). compare_forward names layers.3.self_attn.k.
2. e2b_like: reader layer 6 reads owner 5's K/V detached (what a shared-KV dict
   rebuilt per layer does to the gradient): the forward is right, and compare_grads
   names owner layer 5's projection, the first tensor whose gradient lacks the
   reader's share.
"""

import os
import sys

import torch
import transformers
from safetensors.torch import load_file
from transformers.models.gemma4 import modeling_gemma4 as mg

import gemma4.torch as g4t

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "data")


def load(name):
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_pretrained(
        os.path.join(DATA, "tiny", name), dtype=torch.float32, attn_implementation="eager")


def plant_own_kv(model, layer, checkpoint):
    """Reader `layer` computes K/V with its own (stale) k_proj, v_proj, k_norm from the file."""
    attn = model.model.layers[layer].self_attn
    sd = load_file(os.path.join(checkpoint, "model.safetensors"))
    p = f"model.layers.{layer}.self_attn."
    cfg = model.config
    k = sd[p + "k_proj.weight"].float()
    attn.k_proj = torch.nn.Linear(cfg.hidden_size, k.shape[0], bias=False)
    attn.v_proj = torch.nn.Linear(cfg.hidden_size, k.shape[0], bias=False)
    attn.k_norm = mg.Gemma4RMSNorm(attn.head_dim, eps=cfg.rms_norm_eps)
    attn.v_norm = mg.Gemma4RMSNorm(attn.head_dim, eps=cfg.rms_norm_eps, with_scale=False)
    with torch.no_grad():
        attn.k_proj.weight.copy_(k)
        attn.v_proj.weight.copy_(sd[p + "v_proj.weight"].float())
        attn.k_norm.weight.copy_(sd[p + "k_norm.weight"].float())
    attn.is_kv_shared_layer = False


class Detached(dict):
    """A shared-KV dict whose reads come back cut from the graph."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def __getitem__(self, key):
        k, v = self.inner[key]
        return k.detach(), v.detach()


def plant_detached_read(model, layer):
    def pre(_mod, args, kwargs):
        kwargs["shared_kv_states"] = Detached(kwargs["shared_kv_states"])
        return args, kwargs
    return model.model.layers[layer].self_attn.register_forward_pre_hook(pre, with_kwargs=True)


def show(r):
    """The report's header, the rows around the first difference, its last line."""
    lines = str(r).splitlines()
    k = next(i for i, l in enumerate(lines) if "<== first" in l)
    print("\n".join(lines[:1] + lines[max(1, k - 3):k + 4] + ["..."] + lines[-1:]))
    print(f"first: {r.first} (layer {r.layer})")


def main():
    ids = [2, 81, 101, 7, 45, 300, 12, 99, 410, 5, 6, 333]
    m = load("legacy_keys")
    print("== legacy_keys as loaded: compare_forward")
    r = g4t.compare_forward(m, ids)
    print(f"first: {r.first}")
    plant_own_kv(m, 3, os.path.join(DATA, "tiny", "legacy_keys"))
    print("== legacy_keys, reader layer 3 computing its own K/V from the stale weights: compare_forward")
    r = g4t.compare_forward(m, ids)
    show(r)

    m = load("e2b_like")
    x = torch.tensor([ids])
    m(input_ids=x, labels=x).loss.backward()
    print("== e2b_like as loaded: compare_grads")
    print(f"first: {g4t.compare_grads(m, ids).first}")
    m.zero_grad()
    h = plant_detached_read(m, 6)
    print("== e2b_like, reader layer 6 reading owner 5's K/V detached: compare_forward, then compare_grads")
    print(f"forward first: {g4t.compare_forward(m, ids).first}")
    m(input_ids=x, labels=x).loss.backward()
    show(g4t.compare_grads(m, ids))
    h.remove()


if __name__ == "__main__":
    if len(sys.argv) > 1:
        DATA = sys.argv[1]
    main()
