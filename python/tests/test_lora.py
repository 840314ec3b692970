"""PEFT LoRA adapters through Model(path, adapter=...): the goldens of
data/lora/ (transformers + peft 0.21.2, tools/make_lora_goldens.py), as
tests/test_lora.c checks them: logits (the first 128 vocabulary columns) within
2e-5 of max |ref|, greedy token for token, adapter-only gradients within 1e-4 of
each tensor's max |ref| and the loss within 1e-5 relative."""

import os

import numpy as np
import pytest

import gemma4
from conftest import DATA, TOL, rel, tiny
from gemma4 import safetensors as st

CASES = [("e2b_all", "e2b_like"), ("31b_qv_rslora", "31b_like"), ("26b_regex", "26b_like"),
         ("plain_layers", "plain"), ("legacy_patterns", "legacy_keys"), ("e4b_multimodal", "e4b_like")]
GRAD_CASES = [("e2b_all", "e2b_like"), ("26b_regex", "26b_like"), ("legacy_patterns", "legacy_keys")]


def lora(name):
    return os.path.join(DATA, "lora", name)


@pytest.mark.parametrize("adapter,name", CASES)
def test_adapter_logits_and_greedy(model, adapter, name):
    g = st.load(os.path.join(lora(adapter), "golden.safetensors"))[0]
    m = model(name, lora(adapter))
    ids, ref = g["input_ids"], g["logits"]
    cols = ref.shape[1]
    out = m.logits(ids)[:, :cols]
    assert rel(out, ref) <= TOL
    assert rel(model(name).logits(ids)[:, :cols], ref) > 100 * TOL, "the adapter changes the logits"
    want, prompt = g["greedy_ids"], 6  # the prompt's 6 ids, then peft's generate's 8
    assert np.array_equal(want[:prompt], ids[:prompt])
    assert m.generate(want[:prompt], len(want) - prompt).tolist() == want[prompt:].tolist()


@pytest.mark.parametrize("adapter,name", GRAD_CASES)
def test_adapter_gradients(model, adapter, name):
    g = st.load(os.path.join(lora(adapter), "golden.safetensors"))[0]
    m = model(name, lora(adapter))
    loss, grads = m.loss_and_grad(g["input_ids"], labels=g["labels"])
    assert abs(loss - g["loss"][0]) <= 1e-5 * abs(g["loss"][0])
    assert len(grads) == 2 * m.n_lora and all(".lora_A." in k or ".lora_B." in k for k in grads)
    for k, v in grads.items():
        ref = g["grad." + k]
        assert v.shape == ref.shape, k
        assert np.abs(ref).max() > 0 and rel(v, ref) <= 1e-4, k
