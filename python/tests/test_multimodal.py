"""Images and audio through the package: the vision tower's soft tokens and the
merged logits of tests/test_vision.c's goldens (data/vision/: transformers'
image processor outputs and the e2b_mm / 31b_mm models), and the audio
pipeline of tests/test_audio.c's (data/tiny/e2b_audio: WAV -> log-mel features
-> audio tower -> soft tokens). Tolerances are those suites': features 2e-6
absolute, masks equal, soft tokens 1e-4 (vision: of max |golden|; audio:
absolute), logits 1e-4 of max |logit|. The audio goldens' logits (both clips
merged into the decoder) are checked at the same 1e-4 of max |logit|."""

import os

import numpy as np
import pytest

import gemma4
from conftest import DATA, rel, tiny
from gemma4 import safetensors as st

VISION = os.path.join(DATA, "vision")


@pytest.fixture(scope="module")
def processor():
    return st.load(os.path.join(VISION, "processor.safetensors"))[0]


def soft_of_case(m, p, c):
    """case 3 holds case 0's and case 1's images, in turn (tests/test_vision.c encode_case)"""
    out = []
    for k in ([0, 1] if c == 3 else [c]):
        pv, pos = p[f"pixel_values.{k}"], p[f"positions.{k}"]
        for i in range(pv.shape[0]):
            out.append(m.encode_image(pv[i], pos[i]))
    return np.concatenate(out)


@pytest.mark.parametrize("model", ["e2b_mm", "31b_mm"])
def test_vision_soft_tokens_and_logits(processor, model):
    g = st.load(os.path.join(VISION, model, "golden.safetensors"))[0]
    m = gemma4.Model(os.path.join(VISION, model), threads=2)
    cases = 0
    for c in range(4):
        if f"logits.{c}" not in g:
            continue
        soft = soft_of_case(m, processor, c)
        if f"soft.{c}" in g:
            assert rel(soft, g[f"soft.{c}"]) <= 1e-4, f"{model} case {c} soft tokens"
        ids = processor[f"ids.{c}"]
        logits = m.logits(ids, soft=soft)
        rows = g[f"logit_rows.{c}"]
        ref = g[f"logits.{c}"]
        d = np.abs(logits[rows].astype(np.float64) - ref).max()
        assert d <= 1e-4 * np.abs(ref).max(), f"{model} case {c}: logits {d:.3g} of max {np.abs(ref).max():.3g}"
        cases += 1
    assert cases >= 3
    # the placeholders must get their soft tokens: one fewer is an error naming the counts
    soft = soft_of_case(m, processor, 0)
    with pytest.raises(gemma4.InputError) as e:
        m.logits(processor["ids.0"], soft=soft[:-1])
    assert "soft tokens" in str(e.value)
    with pytest.raises(gemma4.InputError) as e:  # too few values per patch: refused before the library reads past them
        m.encode_image(processor["pixel_values.0"][0][:, :5], processor["positions.0"][0])
    assert "values per patch" in str(e.value)
    with pytest.raises(gemma4.InputError):
        gemma4.Model(tiny("e2b_like"), threads=1).encode_image(processor["pixel_values.0"][0], processor["positions.0"][0])


TEXTS = ["Look at <|image|> and say", "<|image|> is square", "Alpha <|image|>: what", "First <|image|> then <|image|> end"]
CASE_IMAGES = [[0], [1], [2], [0, 1]]  # tools/make_vision_goldens.py's cases (tests/test_vision.c)


def test_image_processor_and_expansion(processor):
    """Raw images -> pixel_values, positions bit for bit, the prompt's ids as Gemma4Processor's,
    then the whole pipeline's logits (1e-4 of max |logit|)."""
    m = gemma4.Model(os.path.join(VISION, "e2b_mm"), threads=2)
    g = st.load(os.path.join(VISION, "e2b_mm", "golden.safetensors"))[0]
    tok = gemma4.Tokenizer(os.path.join(VISION, "processor"))
    for c, text in enumerate(TEXTS):
        pre = [m.preprocess_image(processor[f"image.{k}"].astype(np.uint8), os.path.join(VISION, "processor"))
               for k in CASE_IMAGES[c]]
        if c < 3:
            assert np.array_equal(pre[0][0], processor[f"pixel_values.{c}"][0]), f"case {c} pixel_values"
            assert np.array_equal(pre[0][1], processor[f"positions.{c}"][0]), f"case {c} positions"
        ids = m.expand_images(tok.encode(text), [p[2] for p in pre])
        assert np.array_equal(ids, processor[f"ids.{c}"]), f"case {c} ids"
        soft = np.concatenate([m.encode_image(pv, pos) for pv, pos, _ in pre])
        logits = m.logits(ids, soft=soft)
        ref = g[f"logits.{c}"]
        assert np.abs(logits[g[f"logit_rows.{c}"]] - ref).max() <= 1e-4 * np.abs(ref).max(), f"case {c} logits"
    with pytest.raises(gemma4.InputError):
        m.expand_images(tok.encode(TEXTS[0]), [63, 63])
    with pytest.raises(gemma4.InputError):
        m.preprocess_image(np.zeros((4, 4), np.uint8))
    with pytest.raises(gemma4.Error):
        m.preprocess_image(np.zeros((0, 5, 3), np.uint8))


def test_audio_features_tower_and_logits():
    d = tiny("e2b_audio")
    g = st.load(os.path.join(d, "golden.safetensors"))[0]
    m = gemma4.Model(d, threads=2)
    softs = []
    for clip in ("a", "b"):
        pcm, rate = gemma4.read_wav(os.path.join(d, f"clip_{clip}.wav"))
        assert rate == 16000
        feats, mask = gemma4.audio_features(pcm, rate)
        ref = g[f"{clip}.input_features"]
        assert feats.shape == ref.shape and np.abs(feats - ref).max() <= 2e-6
        assert np.array_equal(mask, g[f"{clip}.input_features_mask"] != 0)
        soft = m.encode_audio(feats, mask)
        assert soft.shape == g[f"{clip}.soft_tokens"].shape
        assert np.abs(soft - g[f"{clip}.soft_tokens"]).max() <= 1e-4
        softs.append(soft)
    logits = m.logits(g["ids"], soft=np.concatenate(softs))
    ref = g["logits"]
    cols = ref.shape[1]
    assert rel(logits[:, :cols], ref) <= 1e-4
    # bad audio input
    with pytest.raises(gemma4.InputError):
        gemma4.audio_features(pcm, 22050)
    with pytest.raises(gemma4.InputError):
        gemma4.read_wav(b"RIFF\x00\x00\x00\x00WAVE")
    with pytest.raises(gemma4.InputError):
        m.encode_audio(feats)
    with pytest.raises(gemma4.InputError) as e:
        m.encode_audio(feats[:, :100], mask)
    assert "bins per frame" in str(e.value)
