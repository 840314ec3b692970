"""Forward goldens through the Python API: logits, layer outputs and greedy decode of
every tiny model against transformers (data/tiny/*/golden.safetensors), within
2e-5 of max |ref| as tests/test_gemma4.c (G4I_TOL); every tap of the transformers
dumps (data/dumps/) within `gemma4 compare`'s default tolerances (1e-4 float32,
3e-2 bf16); chunked prefill and decode bit-identical to one prefill."""

import os

import numpy as np
import pytest

import gemma4
from conftest import DATA, TINY, TOL, golden, rel, tiny
from gemma4 import safetensors as st


@pytest.mark.parametrize("name", TINY)
def test_logits_and_layers_match_transformers(model, name):
    g = golden(name)
    m = model(name)
    ids = g["input_ids"]
    logits = m.logits(ids)
    assert logits.dtype == np.float32 and logits.shape == (len(ids), m.vocab_size)
    assert rel(logits, g["logits"]) <= TOL
    taps = m.taps(ids)
    L = m.config["num_hidden_layers"]
    assert rel(taps["embed_tokens"], g["embed"]) <= TOL
    assert rel(taps["norm"], g["final_norm"]) <= TOL
    for i in range(L):
        assert rel(taps[f"layers.{i}"], g[f"layer.{i}"]) <= TOL, f"layer {i}"
    if "per_layer_inputs" in g:
        assert rel(taps["per_layer_inputs"], g["per_layer_inputs"].reshape(len(ids), -1)) <= TOL  # [S, L, P] flat
    # the logits tap is the logits
    assert np.array_equal(taps["logits"], logits)


@pytest.mark.parametrize("name", TINY)
def test_greedy_matches_generate(model, name):
    g = golden(name)
    m = model(name)
    want, prompt = g["greedy_ids"], 6
    new = m.generate(want[:prompt], len(want) - prompt)
    assert new.tolist() == want[prompt:].tolist()
    # the decode logits transformers saw at each step, through a Session
    with m.session(max_context=len(want)) as s:
        logits = s.forward(want[:prompt])
        for k in range(len(want) - prompt):
            assert rel(logits, g["greedy_logits"][k]) <= TOL, f"step {k}"
            assert int(np.argmax(logits)) == want[prompt + k]
            if prompt + k + 1 < len(want):
                logits = s.forward(want[prompt + k:prompt + k + 1])
        assert s.pos == len(want) - 1


def test_chunked_and_decode_are_bit_identical(model):
    m = model("e2b_like")  # window 8 < 24 tokens: sliding rings wrap
    ids = golden("e2b_like")["input_ids"]
    ref = m.logits(ids)
    for chunk in (1, 3, 13):
        assert np.array_equal(m.logits(ids, chunk=chunk), ref), f"chunk {chunk}"
    with m.session(max_context=len(ids), chunk=2) as s:
        rows = [s.forward(ids[i:i + 1]) for i in range(len(ids))]
    assert np.array_equal(np.stack(rows), ref)


def test_session_rewind_and_reset(model):
    m = model("e2b_like")
    ids = golden("e2b_like")["input_ids"]
    ref = m.logits(ids)
    with m.session(max_context=len(ids), chunk=4) as s:
        s.forward(ids[:10], logits="none")
        s.forward(ids[10:13], logits="none")
        s.rewind(10)
        assert s.pos == 10
        assert np.array_equal(s.forward(ids[10:14], logits="all"), ref[10:14])
        s.reset()
        assert s.pos == 0
        out = np.empty(m.vocab_size, np.float32)
        r = s.forward(ids[:5], out=out)
        assert r is out and np.array_equal(out, ref[4])


def test_forward_hidden_is_the_norm_tap(model):
    m = model("e2b_like")
    ids = golden("e2b_like")["input_ids"][:7]
    with m.session(max_context=8) as s:
        logits, hidden = s.forward(ids, logits="all", hidden=True)
    assert np.array_equal(hidden, m.taps(ids, names=["norm"])["norm"])


def test_taps_filter_and_order(model):
    m = model("e2b_like")
    ids = golden("e2b_like")["input_ids"][:5]
    t = m.taps(ids, names=["layers.3.*", "norm"])
    assert list(t)[0] == "layers.3.input_layernorm" and list(t)[-1] == "norm"
    assert all(k.startswith("layers.3.") or k in ("layers.3", "norm") for k in t)
    assert "layers.3.self_attn.q" in t and t["layers.3.self_attn.q"].shape[0] == 5


def _dump_cases():
    out = []
    for f in sorted(os.listdir(os.path.join(DATA, "dumps"))):
        model = f.split("_bf16")[0].split("_f32")[0]
        if os.path.isdir(tiny(model)):
            out.append((f, model))
    return out


@pytest.mark.parametrize("dump,name", _dump_cases())
def test_every_tap_of_the_transformers_dumps(dump, name):
    """gemma4 compare's logic: every tap in the dump within its tolerance."""
    d = st.load(os.path.join(DATA, "dumps", dump))[0]
    bf16 = "_bf16" in dump
    tol = 3e-2 if bf16 else 1e-4
    m = gemma4.Model(tiny(name), bf16=bf16, threads=1)
    taps = m.taps(d["input_ids"])
    compared = 0
    for k, ref in d.items():
        if k == "input_ids":
            continue
        assert k in taps, f"{dump}: the dump's tap {k} is not one of ours"
        assert rel(taps[k], ref) <= tol, f"{dump}: {k}"
        compared += 1
    assert compared >= 2
    m.close()


def test_bf16_mode_differs_from_float32(model):
    """The bf16 flag reaches the library: a bf16 run is not the float32 run."""
    ids = golden("e2b_like")["input_ids"]
    a = model("e2b_like").logits(ids)
    b = gemma4.Model(tiny("e2b_like"), bf16=True, threads=1).logits(ids)
    assert 1e-4 < rel(b, a) < 3e-1


def test_config_and_plan(model):
    m = model("e2b_like")
    c = m.config
    assert c["num_hidden_layers"] == 10 and c["vocab_size"] == 512 and c["hidden_size"] == 32
    p = m.plan()
    readers = [i for i, l in enumerate(p["layers"]) if l["reads"] >= 0]
    assert p["first_shared"] == min(readers) and p["n_slots"] == p["first_shared"]
    for i in readers:  # a reader reads the last owner of its type
        own = p["layers"][i]["reads"]
        assert own < p["first_shared"] and p["layers"][own]["type"] == p["layers"][i]["type"]
        assert not any(p["layers"][j]["type"] == p["layers"][i]["type"] for j in range(own + 1, p["first_shared"]))
    assert "reads" in m.plan_text() and m.plan_text().count("\n") == 9
