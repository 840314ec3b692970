"""gemma4.torch on real transformers models (make test-python-torch: needs torch,
transformers and peft, as tools/requirements.txt; skipped without them).
compare_forward and compare_grads agree with an untouched model (taps within
1e-4, gradients within 1e-3 of each tensor's max), on a PEFT-wrapped model and
under wrapper prefixes, and name the planted faults of examples/planted_faults.py:
a reader computing its own K/V (layers.3.self_attn.k) and a reader whose K/V read
is detached (owner layer 5's gradient)."""

import os
import sys

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import gemma4  # noqa: E402
import gemma4.torch as g4t  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))
sys.path.insert(0, os.path.join(HERE, ".."))
import planted_faults as pf  # noqa: E402
from conftest import DATA  # noqa: E402

pf.DATA = DATA

IDS = [2, 81, 101, 7, 45, 300, 12, 99, 410, 5, 6, 333]


def backward(m, ids=IDS):
    m.zero_grad()
    x = torch.tensor([ids])
    m(input_ids=x, labels=x).loss.backward()


@pytest.mark.parametrize("name", ["e2b_like", "e4b_like", "26b_like", "31b_like", "legacy_keys"])
def test_untouched_models_agree(name):
    m = pf.load(name)
    r = g4t.compare_forward(m, IDS)
    assert r.ok, str(r)
    assert sum(row["status"] == "ok" for row in r.rows) >= 2 + m.config.get_text_config().num_hidden_layers * 8
    backward(m)
    r = g4t.compare_grads(m, IDS)
    assert r.ok, str(r)
    assert len(r.rows) > 20 and all(row["status"] == "ok" for row in r.rows)


def test_reader_computing_its_own_kv_is_named():
    m = pf.load("legacy_keys")
    pf.plant_own_kv(m, 3, os.path.join(DATA, "tiny", "legacy_keys"))
    r = g4t.compare_forward(m, IDS)
    assert r.first == "layers.3.self_attn.k" and r.layer == 3


def test_detached_reader_gradient_is_named_at_its_owner():
    m = pf.load("e2b_like")
    h = pf.plant_detached_read(m, 6)
    assert g4t.compare_forward(m, IDS).ok  # the forward is right
    backward(m)
    r = g4t.compare_grads(m, IDS)
    assert r.layer == 5 and ".self_attn." in r.first, r.first
    h.remove()


def test_peft_model():
    peft = pytest.importorskip("peft")
    m = pf.load("e2b_like")
    pm = peft.PeftModel.from_pretrained(m, os.path.join(DATA, "lora", "e2b_all"), is_trainable=True)
    r = g4t.compare_forward(pm, IDS)
    assert r.ok, str(r)
    backward(pm)
    r = g4t.compare_grads(pm, IDS)
    assert r.ok, str(r)
    assert all(".lora_" in row["name"] for row in r.rows) and len(r.rows) == 166
    # a planted fault in one adapter gradient is named
    p = dict(pm.named_parameters())["base_model.model.model.layers.7.mlp.up_proj.lora_B.default.weight"]
    p.grad[0, 0] += 0.01 * p.grad.abs().max()
    r = g4t.compare_grads(pm, IDS)
    assert r.first == "base_model.model.model.layers.7.mlp.up_proj.lora_B.weight", r.first


class Wrapper(torch.nn.Module):
    """A DDP-like outer module: every name gains "module." (the attribute `wraps` names)."""

    wraps = "module"

    def __init__(self, inner):
        super().__init__()
        setattr(self, self.wraps, inner)

    def forward(self, *a, **k):
        return getattr(self, self.wraps)(*a, **k)


class Shard(Wrapper):
    """An FSDP1-like wrapper: the layer's names gain "_fsdp_wrapped_module."; attributes pass through."""

    wraps = "_fsdp_wrapped_module"

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._fsdp_wrapped_module, name)


def test_wrapper_prefixes():
    m = pf.load("e2b_like")
    for i in range(len(m.model.layers)):
        m.model.layers[i] = Shard(m.model.layers[i])
    w = Wrapper(m)
    names = [n for n, _ in w.named_parameters()]
    assert "module.model.layers.3._fsdp_wrapped_module.self_attn.q_proj.weight" in names
    r = g4t.compare_forward(w, IDS)
    assert r.ok, str(r)
    assert "layers.3.self_attn.q" in [row["name"] for row in r.rows if row["status"] == "ok"]
    backward(w)
    r = g4t.compare_grads(w, IDS)
    assert r.ok and len(r.rows) == 153, str(r)
    # and a fault there is still named
    p = dict(w.named_parameters())["module.model.layers.3._fsdp_wrapped_module.mlp.gate_proj.weight"]
    p.grad[1, 2] += 0.01 * p.grad.abs().max()
    assert g4t.compare_grads(w, IDS).first == "model.layers.3.mlp.gate_proj.weight"


def test_checkpoint_wrapper_names():
    """torch's checkpoint_wrapper (names gain _checkpoint_wrapped_module): the forward
    compares. (Its backward recomputes the layers and fails inside transformers 5.23's
    shared-KV dict, a size mismatch, before any gradient exists: not tested here.)"""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    m = pf.load("e2b_like")
    for i in range(len(m.model.layers)):
        m.model.layers[i] = checkpoint_wrapper(m.model.layers[i])
    assert any("._checkpoint_wrapped_module." in n for n, _ in m.named_modules())
    r = g4t.compare_forward(m, IDS)
    assert r.ok and sum(row["status"] == "ok" for row in r.rows) == 144, str(r)


def test_bf16_model():
    """A bfloat16 model: the reference is exported as bf16 and runs gemma4.h's bf16 mode
    (tolerance 3e-2, compare's default for bf16)."""
    m = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.join(DATA, "tiny", "e2b_like"), dtype=torch.bfloat16, attn_implementation="eager")
    r = g4t.compare_forward(m, IDS)
    assert r.ok and r.tolerance == 3e-2, str(r)
    assert sum(row["status"] == "ok" for row in r.rows) == 144
