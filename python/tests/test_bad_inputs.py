"""Bad input through the Python API (a subset of tests/test_bad_inputs.c's
catalogue, plus what only Python can pass): every case raises a gemma4.Error
(InputError for arguments, LoadError for files) whose message names the file,
field, tensor or id, and the interpreter survives. After the errors a model and
a session still compute the same logits."""

import json
import os
import shutil

import numpy as np
import pytest

import gemma4
from conftest import DATA, golden, tiny


def copy_model(tmp_path, name="e2b_like"):
    d = tmp_path / name
    shutil.copytree(tiny(name), d)
    return d


# ------------------------------------------------------------------ loading

def test_bad_paths(tmp_path):
    with pytest.raises(gemma4.LoadError) as e:
        gemma4.Model(str(tmp_path / "nope"))
    assert "nope" in str(e.value) and e.value.name == "G4_ERR_IO"
    with pytest.raises(gemma4.LoadError):
        gemma4.Model(os.path.join(tiny("e2b_like"), "config.json"))  # a file, not a directory
    with pytest.raises(gemma4.InputError):
        gemma4.Model("a\0b")
    with pytest.raises(TypeError):
        gemma4.Model(42)
    for bad in (0, -1, 1025, 2 ** 40, 1.5, "2"):
        with pytest.raises(gemma4.InputError):
            gemma4.Model(tiny("plain"), threads=bad)


@pytest.mark.parametrize("edit,needle", [
    (lambda c: c.update(hidden_size="32"), "hidden_size"),
    (lambda c: c.update(num_hidden_layers=-1), "num_hidden_layers"),
    (lambda c: c.update(vocab_size=10 ** 12), "vocab_size"),
    (lambda c: c.update(head_dim=0), "field 'head_dim' is 0"),
    (lambda c: c.update(layer_types=["full_attention"] * 3), "field 'layer_types' must be an array of num_hidden_layers"),
    (lambda c: c.update(num_kv_shared_layers=10), "num_kv_shared_layers (10)"),
])
def test_bad_config(tmp_path, edit, needle):
    d = copy_model(tmp_path)
    c = json.load(open(d / "config.json"))
    edit(c.get("text_config", c))
    json.dump(c, open(d / "config.json", "w"))
    with pytest.raises(gemma4.LoadError) as e:
        gemma4.Model(str(d))
    assert "config.json" in str(e.value) and needle in str(e.value), str(e.value)
    assert e.value.name == "G4_ERR_CONFIG"


def test_config_not_json(tmp_path):
    d = copy_model(tmp_path)
    (d / "config.json").write_text('{"model_type": "gemma4_text", ')
    with pytest.raises(gemma4.LoadError) as e:
        gemma4.Model(str(d))
    assert "config.json" in str(e.value) and e.value.name == "G4_ERR_JSON"


def test_truncated_and_corrupt_safetensors(tmp_path):
    d = copy_model(tmp_path)
    f = d / "model.safetensors"
    raw = f.read_bytes()
    f.write_bytes(raw[:-100])
    with pytest.raises(gemma4.LoadError) as e:
        gemma4.Model(str(d))
    assert "model.safetensors" in str(e.value)
    f.write_bytes(raw[:3])
    with pytest.raises(gemma4.LoadError):
        gemma4.Model(str(d))
    f.write_bytes(b"\xff" * 8 + raw[8:])  # a header length beyond the file
    with pytest.raises(gemma4.LoadError):
        gemma4.Model(str(d))


def test_missing_tensor(tmp_path):
    from gemma4 import safetensors as st
    d = copy_model(tmp_path, "plain")
    t, meta = st.load(d / "model.safetensors")
    name = next(k for k in t if k.endswith("layers.1.mlp.down_proj.weight"))
    del t[name]
    st.save(d / "model.safetensors", {k: v.astype(np.float32) for k, v in t.items()})
    with pytest.raises(gemma4.LoadError) as e:
        gemma4.Model(str(d))
    assert "layers.1.mlp.down_proj" in str(e.value)


def test_bad_adapters(tmp_path):
    with pytest.raises(gemma4.LoadError) as e:
        gemma4.Model(tiny("plain"), adapter=str(tmp_path / "none"))
    assert "none" in str(e.value)
    with pytest.raises(gemma4.LoadError) as e:  # another model's adapter: its modules do not fit
        gemma4.Model(tiny("plain"), adapter=os.path.join(DATA, "lora", "26b_regex"))
    bad = tmp_path / "ad"
    shutil.copytree(os.path.join(DATA, "lora", "plain_layers"), bad)
    c = json.load(open(bad / "adapter_config.json"))
    c["use_dora"] = True
    json.dump(c, open(bad / "adapter_config.json", "w"))
    with pytest.raises(gemma4.LoadError) as e:
        gemma4.Model(tiny("plain"), adapter=str(bad))
    assert "use_dora" in str(e.value)
    (bad / "adapter_config.json").write_text("[1]")
    with pytest.raises(gemma4.LoadError):
        gemma4.Model(tiny("plain"), adapter=str(bad))


# ---------------------------------------------------------------- running

@pytest.fixture(scope="module")
def m():
    return gemma4.Model(tiny("e2b_like"), threads=1)


@pytest.mark.parametrize("ids,needle", [
    ([2, 512], "token id 512 at index 1 is outside the vocabulary [0, 512)"),
    ([2, -1], "-1 at index 1"),
    ([2 ** 31 - 1], "token id 2147483647"),
    ([2 ** 31], "2147483648 at index 0"),      # would wrap to a valid id in int32
    ([2 ** 32 + 5], "4294967301 at index 0"),  # so would this
    (np.array([3, -(2 ** 40)], np.int64), "at index 1"),
    ([], "empty"),
    ([[2, 3]], "1-D"),
    ([2.5], "integers"),
    (["2"], "integers"),
])
def test_bad_ids(m, ids, needle):
    for call in (m.logits, m.taps, lambda x: m.generate(x, 2), m.loss_and_grad):
        with pytest.raises(gemma4.InputError) as e:
            call(ids)
        assert needle in str(e.value), str(e.value)


def test_session_limits_and_recovery(m):
    ids = golden("e2b_like")["input_ids"]
    with m.session(max_context=6, chunk=2) as s:
        with pytest.raises(gemma4.InputError) as e:
            s.forward(ids[:7])
        assert "exceed the session's max_context of 6" in str(e.value) and s.pos == 0
        s.forward(ids[:4])
        with pytest.raises(gemma4.InputError):
            s.forward([2, 512])
        assert s.pos == 4, "an error does not advance the session"
        with pytest.raises(gemma4.InputError):
            s.forward(ids[:3])
        with pytest.raises(gemma4.InputError):
            s.rewind(5)
        with pytest.raises(gemma4.InputError):
            s.forward(ids[:2], logits="some")
        with pytest.raises(gemma4.InputError):
            s.forward(ids[:2], logits="all", out=np.empty((2, 511), np.float32))
        s.reset()
        a = s.forward(ids[:5])
    assert np.array_equal(a, m.logits(ids[:5])[-1])
    for bad in (0, -3, 1.5, 2 ** 40):
        with pytest.raises(gemma4.InputError):
            m.session(max_context=bad)
    with pytest.raises(gemma4.InputError):
        m.session(max_context=8, chunk=-1)
    with pytest.raises(gemma4.InputError):
        m.session(max_context=8, threads=2 ** 40)


def test_bad_labels(m):
    ids = golden("e2b_like")["input_ids"][:8]
    with pytest.raises(gemma4.InputError) as e:
        m.loss_and_grad(ids, labels=[1] * 7)
    assert "7 labels for 8 ids" in str(e.value)
    with pytest.raises(gemma4.InputError) as e:
        m.loss_and_grad(ids, labels=[1] * 7 + [512])
    assert "label 512 at index 7" in str(e.value)
    with pytest.raises(gemma4.InputError):
        m.loss_and_grad(ids, labels=[1] * 7 + [-101])


def test_bad_sampling_and_generate_arguments(m):
    with pytest.raises(gemma4.InputError) as e:
        m.generate([2, 3], 4, temperature=-1)
    assert "sampler" in str(e.value)
    with pytest.raises(gemma4.InputError):
        m.generate([2, 3], 4, top_p=0)
    with pytest.raises(gemma4.InputError):
        m.generate([2, 3], -1)
    with pytest.raises(gemma4.InputError):
        m.generate([2, 3], 4, seed=-1)


def test_closed_objects(tmp_path):
    mm = gemma4.Model(tiny("plain"), threads=1)
    s = mm.session(max_context=4)
    mm.close()
    with pytest.raises(gemma4.Error):
        s.forward([2])
    with pytest.raises(gemma4.Error):
        mm.logits([2])
    mm.close()  # twice is fine


def test_bad_tokenizer_inputs(tmp_path):
    with pytest.raises(gemma4.LoadError):
        gemma4.Tokenizer(str(tmp_path / "none.json"))
    (tmp_path / "tokenizer.json").write_text('{"model": {"type": "WordPiece"}}')
    with pytest.raises(gemma4.Error):
        gemma4.Tokenizer(str(tmp_path))
    tok = gemma4.Tokenizer(os.path.join(DATA, "tokenizer", "tokenizer.json"))
    with pytest.raises(gemma4.InputError) as e:
        tok.decode([2, tok.vocab_size])
    assert f"id {tok.vocab_size} at index 1" in str(e.value)
    with pytest.raises(gemma4.InputError):
        tok.chat([{"role": "user"}])
    with pytest.raises(gemma4.InputError) as e:
        gemma4.ChatTemplate(source="{% for x in y %}", name="t.jinja")
    assert "t.jinja" in str(e.value)
    with pytest.raises(gemma4.LoadError):
        gemma4.ChatTemplate(source="hi").render("not json")


def test_everything_still_computes_after_the_errors(m):
    ids = golden("e2b_like")["input_ids"]
    fresh = gemma4.Model(tiny("e2b_like"), threads=1)
    assert np.array_equal(m.logits(ids), fresh.logits(ids))
