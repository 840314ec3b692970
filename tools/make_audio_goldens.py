#!/usr/bin/env python3
"""Golden data for gemma4.h's audio tower and audio feature extractor.

Builds a tiny random-weight E2B-style Gemma4ForConditionalGeneration (PLE, shared KV, an audio
tower with clipped linears; no vision tower) WITH transformers, saves it as a real checkpoint,
reloads it in float32 and records, for two clips:

    data/tiny/e2b_audio/config.json, model.safetensors   the checkpoint (stored bfloat16)
    data/tiny/e2b_audio/clip_a.wav                        16130 samples, PCM16 mono 16 kHz
    data/tiny/e2b_audio/clip_b.wav                        7000 samples, float32 mono 16 kHz
    data/tiny/e2b_audio/golden.safetensors:
      {a,b}.input_features    F32 [T, 128]     Gemma4AudioFeatureExtractor, one clip at a time
      {a,b}.input_features_mask I32 [T]
      {a,b}.soft_tokens       F32 [n, Ht]      embed_audio's output, padding stripped
      {a,b}.valid             I32 [T2]         the tower's output mask
      a.tap.<module>          F32 [rows, cols] every audio tower module's output, by its
                                               transformers name under model. (audio_tower.*,
                                               embed_audio), batch 1; the layout is the row
                                               layout gemma4.h's taps use (see below);
                                               past layer 0 only layers.<i> and its direct
                                               submodules (the data budget)
      a.tap_rows.<module>     I32 [k]          only for taps stored in part: which rows
      ids                     I32 [S]          a prompt with both clips' placeholder runs
      logits                  F32 [S, V]       Gemma4ForConditionalGeneration(ids, both clips
                                               batched by the feature extractor), float32
      one.ids, one.logits                      the same with clip b alone (one audio run)

Tap layouts: the subsampling layers' [1, C, T, F] outputs are stored as [T][F*C] (channels
last, what input_proj_linear flattens); depthwise_conv1d's [1, H, T] as [T][H]; every other
module's [1, T, X] as [T][X]; rel_pos_enc and self_attn.relative_k_proj as [P][H] with
P = context_size // 2 + 1 positions (distance P-1 first). subsample_conv_projection.layer0 is
64*128 floats a row: only its first and last rows are stored (the data budget).

transformers 5.23 quirks met here (see ../shared/spec/gemma4-multimodal.md): the feature
extractor fails on a single 1-D waveform, so every call passes a list of waveforms;
subsample_conv_projection's input_proj_linear assumes subsampling_conv_channels[0] == 128
(the mel bins), so the config keeps 128 there.

The random scalars are calibrated on the model itself (a first forward with unclipped
bounds): the clipped linears' bounds, gradient_clipping and attention_logit_cap are set where
they clip a few percent of the values, and the script checks that the soft tokens move by
much more than the tolerance when any of them is turned off (so a port that skips one fails).

A second checkpoint, data/tiny/e2b_audio_geom (config.json, model.safetensors, golden.safetensors with
a.tap.* (all but layer0), a.soft_tokens, a.valid), has another attention geometry (chunk 8, context_left
3, context_right 2: one future frame) and no clipped linears; its input is clip a's features above.
VERSIONS.txt covers both.

--bf16 writes only data/tiny/e2b_audio/bf16.safetensors (nothing else is rebuilt): the committed e2b_audio
checkpoint loaded with from_pretrained(dtype=torch.bfloat16, attn_implementation="eager"), as a user runs a
released checkpoint in bf16, on the committed features of clips a and b:
      a.tap.<module>          every audio tower module's output for clip a, in the layouts above, in the
                              dtype the bf16 model gives it (bf16; the attention's float32 parts stay F32);
                              past layer 0 only the layer and its direct submodules; layer0's rows 0 and
                              T1 - 1 only (a.tap_rows.<module>)
      {a,b}.soft_tokens       embed_audio's output, padding stripped (BF16)
      one.logits              the whole model in bf16 on golden.safetensors' one.ids with clip b (BF16 [S, V])
torch must run its AVX2 kernels (ATEN_CPU_CAPABILITY=avx2 on an AVX-512 CPU; the script checks), one thread,
oneDNN off (the script sets torch.backends.mkldnn.enabled = False): the orders gemma4.h's bf16 mode reproduces.

Usage (from the repository root): venv/bin/python tools/make_audio_goldens.py [--out DIR]
       ATEN_CPU_CAPABILITY=avx2 venv/bin/python tools/make_audio_goldens.py --bf16 [--out DIR]
"""

import json
import os
import struct
import sys
import wave

import numpy as np
import torch
from safetensors.torch import save_file

import golden_common  # noqa: E402

golden_common.pin_versions()

from transformers import (  # noqa: E402
    Gemma4AudioConfig,
    Gemma4AudioFeatureExtractor,
    Gemma4Config,
    Gemma4ForConditionalGeneration,
    Gemma4TextConfig,
)

golden_common.deterministic()

SEED = 4242
# The WAVs are the extractor's input: PCM16 samples are k / 32768 (as soundfile reads them).
SL, FU = "sliding_attention", "full_attention"
# Special ids inside the tiny vocabulary (the config's; never hard-coded in gemma4.h).
IDS = dict(image_token_id=240, video_token_id=241, boi_token_id=242, eoi_token_id=243,
           boa_token_id=244, eoa_token_index=245, audio_token_id=246)

TEXT = dict(
    vocab_size=256, hidden_size=32, intermediate_size=48, num_attention_heads=4, head_dim=16,
    global_head_dim=32, rms_norm_eps=1e-6, final_logit_softcapping=30.0, sliding_window=8,
    max_position_embeddings=128, num_hidden_layers=4, layer_types=[SL, FU, SL, FU],
    num_key_value_heads=1, num_kv_shared_layers=2, use_double_wide_mlp=True,
    hidden_size_per_layer_input=8, vocab_size_per_layer_input=256, attention_k_eq_v=False,
    num_global_key_value_heads=None,
    rope_parameters={
        SL: {"rope_type": "default", "rope_theta": 10_000.0},
        FU: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
    },
)
AUDIO = dict(
    hidden_size=24, num_hidden_layers=2, num_attention_heads=3,  # head_dim 8
    subsampling_conv_channels=[128, 4],  # [0] must be 128 (transformers' input_proj_linear)
    conv_kernel_size=5, output_proj_dims=20,  # output_proj_dims != hidden_size
    residual_weight=0.37,
    # the released geometry: a frame attends to itself and the 11 frames before it
    attention_chunk_size=12, attention_context_left=13, attention_context_right=0,
    # not the FFN/layer norms' eps (they keep Gemma4RMSNorm's 1e-6): the subsampling
    # LayerNorms, the light conv's norms and embed_audio's norm use it
    rms_norm_eps=1e-3,
    use_clipped_linears=True,
    # calibrated below (placeholders)
    attention_logit_cap=50.0, gradient_clipping=1e10,
)
CLIP_A = 16130  # not a multiple of 128; its last soft token is padding
CLIP_B = 7000


def waveforms():
    rng = np.random.RandomState(SEED)
    t = np.arange(CLIP_A) / 16000.0
    f = 180 + 900 * t  # a rising tone, a harmonic, an envelope and noise
    a = (0.35 * np.sin(2 * np.pi * np.cumsum(f) / 16000.0) + 0.1 * np.sin(2 * np.pi * 3 * np.cumsum(f) / 16000.0))
    a = a * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t)) + 0.02 * rng.randn(CLIP_A)
    a16 = np.clip(np.round(a * 32768), -32768, 32767).astype(np.int16)
    tb = np.arange(CLIP_B) / 16000.0
    b = 0.5 * np.sign(np.sin(2 * np.pi * 440 * tb)) * np.exp(-3 * tb) + 0.05 * rng.randn(CLIP_B)
    b = b.astype(np.float32)
    return a16, b


def write_wav_pcm16(path, x16):
    with wave.open(path, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(x16.astype("<i2").tobytes())


def write_wav_float32(path, x):
    data = x.astype("<f4").tobytes()
    fmt = struct.pack("<HHIIHH", 3, 1, 16000, 16000 * 4, 4, 32)  # WAVE_FORMAT_IEEE_FLOAT
    fact = struct.pack("<I", len(x))
    body = (b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"fact" + struct.pack("<I", 4) + fact
            + b"data" + struct.pack("<I", len(data)) + data)
    with open(path, "wb") as f:
        f.write(b"RIFF" + struct.pack("<I", len(body)) + body)


def build(audio_over):
    audio = dict(AUDIO)
    audio.update(audio_over)
    cfg = Gemma4Config(text_config=Gemma4TextConfig(**TEXT), vision_config=None,
                       audio_config=Gemma4AudioConfig(**audio), **IDS)
    return cfg


def randomize(model):
    def rule(name, leaf, shape, t, normal, uniform):
        if "audio_tower" in name or "embed_audio" in name:
            if name.endswith("per_dim_scale"):
                return normal(shape, 0.7)
            if "norm" in name and leaf == "weight":
                return uniform(shape, 0.5, 1.5)
            if leaf == "bias":
                return normal(shape, 0.1)
            return normal(shape, 1.0 / np.sqrt(int(np.prod(shape[1:]))))  # linears, convolutions: ~1/sqrt(fan_in)
        v = golden_common.decoder_value(name, leaf, shape, normal, uniform)
        if v is not None:
            return v
        return None if len(shape) == 0 else normal(shape, 0.1)

    golden_common.random_init(model, SEED, rule)


def clippables(tower):
    return [(n, m) for n, m in tower.named_modules() if type(m).__name__ == "Gemma4ClippableLinear"]


def tower_soft_tokens(model, feats, mask):
    with torch.no_grad():
        out = model.model.get_audio_features(torch.from_numpy(feats)[None], torch.from_numpy(mask)[None],
                                             return_dict=True)
    return out.pooler_output[0], out.attention_mask[0]


def calibrate(model, feats, mask):
    """Bounds, gradient_clipping and the logit cap where they clip a few percent."""
    g = torch.Generator().manual_seed(SEED + 1)
    tower = model.model.audio_tower
    seen_in, seen_out, clampv = {}, {}, []
    hooks = []
    for n, m in clippables(tower):
        def h(mod, inp, out, n=n):
            seen_in[n] = inp[0].detach().flatten()
            seen_out[n] = out.detach().flatten()
        hooks.append(m.register_forward_hook(h))
    for layer in tower.layers:  # the residual stream where the clamps act
        hooks.append(layer.feed_forward1.register_forward_hook(lambda m, i, o: clampv.append(o.detach().abs().flatten())))
        hooks.append(layer.lconv1d.depthwise_conv1d.register_forward_hook(lambda m, i, o: clampv.append(o.detach().abs().flatten())))
    # the attention logits: torch.tanh is patched for one forward to see its argument
    real_tanh = torch.tanh
    capv = []

    def spy_tanh(x, *a, **k):
        capv.append(x.detach().abs().flatten())
        return real_tanh(x, *a, **k)
    torch.tanh = spy_tanh
    try:
        tower_soft_tokens(model, feats, mask)
    finally:
        torch.tanh = real_tanh
        for h in hooks:
            h.remove()
    cap_in = torch.cat(capv) * tower.config.attention_logit_cap  # tanh saw logits / cap
    with torch.no_grad():
        for n, m in clippables(tower):
            xi, xo = seen_in[n], seen_out[n]
            qi = [float(torch.quantile(xi, q)) for q in (0.03, 0.97)]
            qo = [float(torch.quantile(xo, q)) for q in (0.03, 0.97)]
            r = lambda: float(0.9 + 0.2 * torch.rand((), generator=g))
            m.input_min.fill_(qi[0] * r())
            m.input_max.fill_(qi[1] * r())
            m.output_min.fill_(qo[0] * r())
            m.output_max.fill_(qo[1] * r())
    gc = float(torch.quantile(torch.cat(clampv), 0.97))
    cap = float(torch.quantile(cap_in[cap_in > 0], 0.9))
    return round(gc, 3), round(cap, 3)


def load(path):
    m = Gemma4ForConditionalGeneration.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    return m.eval()


def tap_name(full):
    return full[len("model."):] if full.startswith("model.") else full


def record_taps(model, feats, mask, raw=False):
    """Every audio tower module's output (batch 1), in gemma4.h's row layouts, float32 through
    tower_soft_tokens; raw: in the model's own dtypes (no float() cast), through get_audio_features."""
    out = {}
    hooks = []
    skip_leaf = (".linear", ".act", ".act_fn", ".conv", ".norm")
    for name, mod in list(model.model.audio_tower.named_modules()) + [("", None)]:
        if mod is None or name == "":
            continue
        if any(name.endswith(s) for s in skip_leaf):  # inner modules (the subsampling's conv, norm)
            continue
        full = "audio_tower." + name

        def h(m, i, o, full=full, name=name):
            x = o[0] if isinstance(o, (tuple, list)) else o
            x = x.detach() if raw else x.detach().float()
            if name.startswith("subsample_conv_projection.layer"):
                x = x[0].permute(1, 2, 0).reshape(x.shape[2], -1)  # [C,T,F] -> [T][F*C]
            elif name.endswith("depthwise_conv1d"):
                x = x[0].transpose(0, 1)  # [H,T] -> [T][H]
            elif name.endswith("relative_k_proj") or name == "rel_pos_enc":
                x = x.reshape(-1, x.shape[-1])
            else:
                x = x[0]
            out[full] = x.contiguous().clone()
        hooks.append(mod.register_forward_hook(h))
    hooks.append(model.model.embed_audio.register_forward_hook(
        lambda m, i, o: out.__setitem__("embed_audio", (o.detach() if raw else o.detach().float())[0].clone())))
    try:
        if raw:
            with torch.no_grad():
                res = model.model.get_audio_features(feats[None], mask[None].bool())
            soft, valid = res.pooler_output[0], res.attention_mask[0]
        else:
            soft, valid = tower_soft_tokens(model, feats, mask)
    finally:
        for h in hooks:
            h.remove()
    return out, soft, valid


# A second, smaller tower with another attention geometry: chunk 8, 2 frames of past and 1 of
# future (context_left 3, context_right 2: a frame sees the 2 before it and the 1 after it), where
# _rel_shift's flat index wraps into the previous query row (chunk - 1 > ceil(ctx / 2): only ever
# at masked logits, so it cannot show); no clipped linears; the default gradient_clipping and cap.
# Its input is e2b_audio's clip a.
GEOM_TEXT = dict(
    vocab_size=256, hidden_size=8, intermediate_size=8, num_attention_heads=1, head_dim=8, global_head_dim=8,
    num_hidden_layers=1, layer_types=[FU], num_key_value_heads=1, num_kv_shared_layers=0,
    hidden_size_per_layer_input=0, attention_k_eq_v=False, num_global_key_value_heads=None,
    max_position_embeddings=64, sliding_window=8,
)
GEOM_AUDIO = dict(
    hidden_size=16, num_hidden_layers=1, num_attention_heads=2, subsampling_conv_channels=[128, 2],
    conv_kernel_size=3, output_proj_dims=12, attention_chunk_size=8, attention_context_left=3,
    attention_context_right=2, rms_norm_eps=1e-5, use_clipped_linears=False,
)


def kept_taps(taps):
    """Clip a's taps as the goldens keep them (the data budget), in taps' order: the subsampler's
    first conv only at its first and last rows (a.tap_rows.<name>), past layer 0 only the layer and
    its direct submodules; keys a.tap.<name>."""
    kept = {}
    for name, x in taps.items():
        if name == "audio_tower.subsample_conv_projection.layer0":
            rows = [0, x.shape[0] - 1]
            kept[f"a.tap_rows.{name}"] = torch.tensor(rows, dtype=torch.int32)
            x = x[rows]
        layer = name.split(".")[2] if name.startswith("audio_tower.layers.") else None
        if layer not in (None, "0") and name.count(".") > 3:
            continue
        kept[f"a.tap.{name}"] = x.contiguous()
    return kept


def make_geom(out, feats_a):
    os.makedirs(out, exist_ok=True)
    cfg = Gemma4Config(text_config=Gemma4TextConfig(**GEOM_TEXT), vision_config=None,
                       audio_config=Gemma4AudioConfig(**GEOM_AUDIO), **IDS)
    torch.manual_seed(SEED + 7)
    model = Gemma4ForConditionalGeneration(cfg).eval()
    randomize(model)
    golden_common.save_bf16(model, out)
    model = load(out)
    taps, soft, valid = record_taps(model, *feats_a)
    golden = {f"a.tap.{k}": v.contiguous() for k, v in taps.items()
              if k != "audio_tower.subsample_conv_projection.layer0"}
    golden["a.soft_tokens"] = soft[valid].contiguous()
    golden["a.valid"] = valid.to(torch.int32)
    # the future frame matters: the same weights with context_right 1 (no future frame seen)
    model.config.audio_config.attention_context_right = 1
    m1 = Gemma4ForConditionalGeneration.from_pretrained(out, config=model.config, dtype=torch.float32,
                                                        attn_implementation="eager").eval()
    s1, v1 = tower_soft_tokens(m1, *feats_a)
    d = float((s1[v1][:-1] - soft[valid][:-1]).abs().max()) if s1[v1].shape == soft[valid].shape else float("inf")
    print(f"geom: {int(valid.sum())} soft tokens; without the future frame they move by {d:.3g}")
    assert d > 1e-2
    save_file({k: v for k, v in sorted(golden.items())}, os.path.join(out, "golden.safetensors"))
    return int(valid.sum())


# Settings unlike every default a released processor_config.json carries (Gemma4AudioFeatureExtractor's
# __init__ arguments: frame/hop in ms, since transformers recomputes frame_length, hop_length and
# fft_length from them and ignores stored sample counts), for gemma4_processing.h's g4_audio_fe_load.
FE_SETTINGS = {"feature_extractor_type": "Gemma4AudioFeatureExtractor", "sampling_rate": 16000, "feature_size": 64,
               "frame_length_ms": 25.0, "hop_length_ms": 12.5, "fft_overdrive": True, "min_frequency": 50.0,
               "max_frequency": 7000.0, "mel_floor": 1e-5, "input_scale_factor": 0.5, "padding_value": 0.0,
               "dither": 0.0, "preemphasis": 0.0, "return_attention_mask": True}


def make_fe_settings_golden(out):
    """clip_a through Gemma4AudioFeatureExtractor(**FE_SETTINGS), loaded as transformers loads a config
    (from_dict): fe_settings.json (the settings, a flat preprocessor_config), fe_settings_golden.safetensors
    (features F32 [nf, 64], mask I32 [nf], frame_length/hop_length/fft_length I32 [3]) and
    FE_SETTINGS_VERSIONS.txt."""
    with wave.open(os.path.join(out, "clip_a.wav"), "rb") as w:
        assert w.getframerate() == 16000 and w.getnchannels() == 1 and w.getsampwidth() == 2
        a16 = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    a = (a16.astype(np.float32) / np.float32(32768.0)).astype(np.float32)  # as main() and soundfile read it
    fe = Gemma4AudioFeatureExtractor.from_dict(dict(FE_SETTINGS))
    assert (fe.frame_length, fe.hop_length, fe.fft_length) == (400, 200, 1024), (fe.frame_length, fe.hop_length)
    r = fe([a], return_tensors="np")
    feats, mask = r["input_features"][0].astype(np.float32), r["input_features_mask"][0].astype(np.int32)
    plain = Gemma4AudioFeatureExtractor()([a], return_tensors="np")["input_features"][0]
    print(f"fe_settings: {feats.shape[0]} frames of {feats.shape[1]} ({int(mask.sum())} valid); defaults give "
          f"{plain.shape}")
    with open(os.path.join(out, "fe_settings.json"), "w") as f:
        json.dump(FE_SETTINGS, f, indent=2)
        f.write("\n")
    save_file({"features": torch.from_numpy(feats), "mask": torch.from_numpy(mask),
               "sizes": torch.tensor([fe.frame_length, fe.hop_length, fe.fft_length], dtype=torch.int32)},
              os.path.join(out, "fe_settings_golden.safetensors"))
    golden_common.write_versions(os.path.join(out, "FE_SETTINGS_VERSIONS.txt"), ("transformers", "numpy"),
                                 "venv/bin/python tools/make_audio_goldens.py --fe-settings-only",
                                 ["Gemma4AudioFeatureExtractor.from_dict(fe_settings.json) on clip_a.wav (PCM16 k / 32768)"])


def bf16_goldens(out):
    from safetensors.torch import load_file
    cap = torch.backends.cpu.get_cpu_capability()
    assert cap == "AVX2", f"the bf16 goldens need torch's AVX2 kernels (ATEN_CPU_CAPABILITY=avx2), not {cap}"
    torch.backends.mkldnn.enabled = False  # ATen's kernels, as on an AVX2-only CPU (see make_vision_goldens.py --bf16)
    g32 = load_file(os.path.join(out, "golden.safetensors"))
    model = Gemma4ForConditionalGeneration.from_pretrained(out, dtype=torch.bfloat16, attn_implementation="eager").eval()
    gold = {}
    for key in ("a", "b"):
        taps, soft, valid = record_taps(model, g32[f"{key}.input_features"], g32[f"{key}.input_features_mask"], raw=True)
        assert torch.equal(valid.to(torch.int32), g32[f"{key}.valid"])
        gold[f"{key}.soft_tokens"] = soft[valid].contiguous()
        if key == "a":
            for k, x in kept_taps(taps).items():
                gold[k] = x
                if k.startswith("a.tap."):
                    print(k[len("a.tap."):], x.dtype, tuple(x.shape))
    with torch.no_grad():
        res = model(input_ids=g32["one.ids"].long()[None], input_features=g32["b.input_features"][None],
                    input_features_mask=g32["b.input_features_mask"][None].bool(), use_cache=False)
    gold["one.logits"] = res.logits[0].contiguous()
    save_file(gold, os.path.join(out, "bf16.safetensors"))
    s32 = g32["a.soft_tokens"]
    d = (gold["a.soft_tokens"].float() - s32).abs().max().item() / s32.abs().max().item()
    golden_common.write_versions(os.path.join(out, "BF16_VERSIONS.txt"), ("torch", "transformers", "safetensors", "numpy"),
                                 "ATEN_CPU_CAPABILITY=avx2 venv/bin/python tools/make_audio_goldens.py --bf16",
                                 ["goldens: e2b_audio loaded with from_pretrained(dtype=torch.bfloat16, "
                                  "attn_implementation=eager), the committed features of clips a and b",
                                  f"clip a's bf16 soft tokens against float32: max |d| {d:.3g} of max |soft|"],
                                 torch=f"{torch.__version__} (cpu capability {cap}, 1 thread, oneDNN off)")
    print(f"clip a: bf16 against float32 {d:.3g}; {len(gold)} tensors")


def main():
    args = golden_common.parse_args(
        "data/tiny/e2b_audio",
        fe_settings_only="remake only fe_settings.json, fe_settings_golden.safetensors, FE_SETTINGS_VERSIONS.txt",
        bf16="write only bf16.safetensors, from the committed model")
    if args.fe_settings_only:
        make_fe_settings_golden(args.out)
        return
    if args.bf16:
        bf16_goldens(args.out)
        return

    a16, b = waveforms()
    write_wav_pcm16(os.path.join(args.out, "clip_a.wav"), a16)
    write_wav_float32(os.path.join(args.out, "clip_b.wav"), b)
    a = (a16.astype(np.float32) / np.float32(32768.0)).astype(np.float32)

    fe = Gemma4AudioFeatureExtractor()
    try:
        fe(a, return_tensors="np")
        print("note: a single 1-D waveform worked (the 5.23 bug is gone?)")
    except ValueError as e:
        print(f"transformers 5.23: a single 1-D waveform fails ({e}); passing a list")
    feats = {}
    for key, x in (("a", a), ("b", b)):
        r = fe([x], return_tensors="np")
        feats[key] = (r["input_features"][0].astype(np.float32), r["input_features_mask"][0].astype(bool))
    both = fe([a, b], return_tensors="np")

    # model: randomize, calibrate the bounds, the clamp and the cap on clip a, save, reload
    torch.manual_seed(SEED)
    cfg = build({})
    model = Gemma4ForConditionalGeneration(cfg).eval()
    randomize(model)
    gc, cap = calibrate(model, *feats["a"])
    print(f"calibrated: gradient_clipping {gc}  attention_logit_cap {cap}")
    model.config.audio_config.gradient_clipping = gc
    model.config.audio_config.attention_logit_cap = cap
    for layer in model.model.audio_tower.layers:
        layer.gradient_clipping = gc
        layer.feed_forward1.gradient_clipping = gc
        layer.feed_forward2.gradient_clipping = gc
        layer.lconv1d.gradient_clipping = gc
        layer.self_attn.attention_logits_soft_cap = cap
        layer.self_attn.softcap.fill_(cap)
    golden_common.save_bf16(model, args.out)
    model = load(args.out)
    assert model.config.audio_config.gradient_clipping == gc and model.config.audio_config.attention_logit_cap == cap

    golden = {}
    soft_of = {}
    for key in ("a", "b"):
        f, m = feats[key]
        golden[f"{key}.input_features"] = torch.from_numpy(f)
        golden[f"{key}.input_features_mask"] = torch.from_numpy(m.astype(np.int32))
        taps, soft, valid = record_taps(model, f, m)
        n = int(valid.sum())
        soft_of[key] = soft[valid]
        golden[f"{key}.soft_tokens"] = soft[valid].contiguous()
        golden[f"{key}.valid"] = valid.to(torch.int32)
        print(f"clip {key}: {len(a if key == 'a' else b)} samples, {f.shape[0]} mel frames ({int(m.sum())} valid), "
              f"{valid.shape[0]} soft tokens ({n} valid)")
        if key == "a":
            golden.update(kept_taps(taps))
            # the transformers masking measured: row 0 of block 1 sees context columns 1..12
            print("taps:", len(taps))

    # sensitivity: each calibrated feature must move the soft tokens far beyond the tolerance
    base = soft_of["a"]
    for what, fn in (
        ("clip bounds off", lambda mm: [setattr(c, "use_clipped_linears", False) for _, c in clippables(mm.model.audio_tower)]),
        ("gradient_clipping off", lambda mm: [setattr(l, "gradient_clipping", 1e10) or setattr(l.feed_forward1, "gradient_clipping", 1e10)
                                              or setattr(l.feed_forward2, "gradient_clipping", 1e10) or setattr(l.lconv1d, "gradient_clipping", 1e10)
                                              for l in mm.model.audio_tower.layers]),
        ("logit cap 50", lambda mm: [l.self_attn.softcap.fill_(50.0) for l in mm.model.audio_tower.layers]),
        ("per_dim_scale 0", lambda mm: [l.self_attn.per_dim_scale.data.zero_() for l in mm.model.audio_tower.layers]),
    ):
        mm = load(args.out)
        with torch.no_grad():
            fn(mm)
        s, v = tower_soft_tokens(mm, *feats["a"])
        d = float((s[v] - base).abs().max())
        print(f"sensitivity: {what}: soft tokens move by {d:.3g}")
        assert d > 1e-2, what

    # the whole model with both clips batched (the processor's layout: b padded to a's length)
    ta, tb = soft_of["a"].shape[0], soft_of["b"].shape[0]
    ids = ([2, 17, 200, IDS["boa_token_id"]] + [IDS["audio_token_id"]] * ta + [IDS["eoa_token_index"], 41, 9,
           IDS["boa_token_id"]] + [IDS["audio_token_id"]] * tb + [IDS["eoa_token_index"], 77, 123])
    ids_t = torch.tensor(ids, dtype=torch.long)[None]
    caught = {}
    hk = model.model.embed_audio.register_forward_hook(lambda m, i, o: caught.__setitem__("e", o.detach()))
    with torch.no_grad():
        res = model(input_ids=ids_t, input_features=torch.from_numpy(both["input_features"]),
                    input_features_mask=torch.from_numpy(both["input_features_mask"]), use_cache=False)
    hk.remove()
    with torch.no_grad():
        _, vb = tower_soft_tokens(model, both["input_features"][1], both["input_features_mask"][1])
    batched_b = caught["e"][1][vb]
    d_batch = float((batched_b - soft_of["b"]).abs().max())
    print(f"clip b alone vs batched (padded to clip a): soft tokens differ by {d_batch:.3g}")
    assert d_batch < 1e-5
    golden["ids"] = torch.tensor(ids, dtype=torch.int32)
    golden["logits"] = res.logits[0].float().contiguous()
    logit_scale = float(res.logits.abs().max())
    print(f"prompt {len(ids)} ids, max|logit| {logit_scale:.3f}")
    # one clip (b) alone, as `gemma4 logits --audio` runs it: the prompt with its run expanded
    ids1 = [2, 17, 200, IDS["boa_token_id"]] + [IDS["audio_token_id"]] * tb + [IDS["eoa_token_index"], 77, 123]
    one = fe([b], return_tensors="pt")
    with torch.no_grad():
        res1 = model(input_ids=torch.tensor(ids1, dtype=torch.long)[None], input_features=one["input_features"],
                     input_features_mask=one["input_features_mask"], use_cache=False)
    golden["one.ids"] = torch.tensor(ids1, dtype=torch.int32)
    golden["one.logits"] = res1.logits[0].float().contiguous()

    save_file({k: v.contiguous() for k, v in sorted(golden.items())}, os.path.join(args.out, "golden.safetensors"))
    n_geom = make_geom(args.out + "_geom", feats["a"])
    with open(os.path.join(args.out, "VERSIONS.txt"), "w") as f:
        f.write(golden_common.versions("torch", "transformers", "safetensors", "numpy") +
                "command venv/bin/python tools/make_audio_goldens.py\n"
                "goldens float32 CPU, attn_implementation=eager, torch.set_num_threads(1); stored bfloat16\n"
                f"calibrated gradient_clipping {gc} attention_logit_cap {cap}\n"
                f"clip a {CLIP_A} samples PCM16, clip b {CLIP_B} samples float32; soft tokens {ta} + {tb}\n"
                f"clip b alone vs batched: max diff {d_batch:.3g}\n"
                f"{os.path.basename(args.out)}_geom: chunk 8, context_left 3, context_right 2, no clipped "
                f"linears; clip a's features in, {n_geom} soft tokens\n")
    make_fe_settings_golden(args.out)
    for f in sorted(os.listdir(args.out)):
        print(f"{f:24s} {os.path.getsize(os.path.join(args.out, f)):8d} bytes")


if __name__ == "__main__":
    main()
