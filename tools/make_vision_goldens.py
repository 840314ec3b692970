#!/usr/bin/env python3
"""Golden data for gemma4.h's vision tower, its merge into the decoder and the image processor.

Builds two tiny random-weight Gemma4ForConditionalGeneration models WITH transformers, saves them as
real checkpoints, reloads them with from_pretrained(dtype=float32) and records, from the reloaded
models and the real Gemma4Processor (torchvision backend, transformers' default when installed):

    data/vision/processor/        processor_config.json, tokenizer.json, tokenizer_config.json
                                  (save_pretrained of the Gemma4Processor used below)
    data/vision/images/           a.png (image 0), c.png (image 2, RGBA), a.jpg (image 0, quality 90)
    data/vision/processor.safetensors
        image.<k>          I16 [h, w, c]   the input images' pixels (c = 3, or 4 for RGBA)
        pixel_values.<c>   F32 [n_img, max_patches, 3 p^2]   the processor's output for case c
        positions.<c>      I32 [n_img, max_patches, 2]       image_position_ids (x, y; -1 padding)
        ids.<c>            I32 [S]                           input_ids
        mm_types.<c>       I32 [S]                           mm_token_type_ids
                           (cases 0-2; case 3's are cases 0 and 1's, as the script checks)
        jpeg_pixels.a      I16 [37, 50, 3]  PIL's decoding of images/a.jpg (libjpeg-turbo)
        pixel_values_x.<k>, positions_x.<k>  images 3 (77x101 RGB, shrinks) and 4 (6x200 RGBA): the
                           processor's output for the real patches (no model runs them)
    data/vision/<model>/config.json, model.safetensors
    data/vision/<model>/golden.safetensors
        soft.<c>           F32 [n_soft, H_text]  get_image_features(...).pooler_output, the images' soft
                                                 tokens concatenated in prompt order
        logits.<c>         F32 [R, V]  logits of rows logit_rows.<c> (a stride through the prompt + the last)
        logit_rows.<c>     I32 [R]
        norm.0             F32 [S, H_text]  case 0: the text model's final norm output (every row)
        tap.<module>       F32 [TAP_ROWS, W]  case 0, image 0: the first TAP_ROWS rows of the output of the
                                             vision module at model.vision_tower.<module> (forward hooks),
                                             and of model.embed_vision (tap.embed_vision)
        tap.embed_vision   F32 [n_soft_0, H_text]  (every row)
        tap.vision_tower   F32 [n_soft_0, H_vis]   Gemma4VisionModel's last_hidden_state (pooled, padding
                                                   stripped, standardized where configured)

Cases: 0 = image A (50x37, needs resizing), 1 = image B (64x64, already at its target size), 2 = image C
(RGBA 60x40 with varying alpha), 3 = images A and B in one prompt.

Models:
    e2b_mm  E2B-style: PLE, shared KV (2 of 6 layers), double-wide MLP; the tower uses clipped linears
            with random finite bounds; no bidirectional attention.
    31b_mm  31B-style: attention_k_eq_v, use_bidirectional_attention "vision"; the tower standardizes
            (random std_bias / std_scale).
Every norm weight, scalar, bound, position table and standardization buffer is random (not its init value).

float32 CPU, attn_implementation="eager", torch.set_num_threads(1), deterministic seeds.

--bf16 writes only the bf16 goldens (nothing else is rebuilt): each committed model (e2b_mm: clipped
linears, default RoPE; 31b_mm: standardize, axial RoPE) loaded with from_pretrained(dtype=torch.bfloat16, attn_implementation="eager"),
as a user runs a released checkpoint in bf16 (model.to(torch.bfloat16) would also round the rotary
embedding's float32 inv_freq, which from_pretrained keeps float32), on the committed pixel values:

    data/vision/<model>/bf16.safetensors   every tensor BF16, as the bf16 model gives it
        tap.<module>       [BF16_TAP_ROWS, W]  case 0's image: the first rows of each tower module's output
                                               (the keys of golden.safetensors' taps)
        tap.vision_tower   [n_soft_0, H_vis]   Gemma4VisionModel's last_hidden_state (every row)
        soft.<k>           [n_soft, H_text]    get_image_features(image k alone).pooler_output, k = 0, 1, 2
                                               (the images of cases 0, 1, 2; soft.0 is also the
                                               embed_vision tap of case 0, not stored twice)
        soft.v0            [3 n_soft, H_text]  get_video_features on case v0's three frames (video.safetensors'
                                               real rows, padded to 280 patches as the processor pads them)
        logits.0           [R, V]              case 0 (image 0 in its prompt): the whole model's logits in bf16 at
                                               golden.safetensors' logit_rows.0
    data/vision/BF16_VERSIONS.txt

torch must run its AVX2 kernels (run with ATEN_CPU_CAPABILITY=avx2 on an AVX-512 CPU; the script checks),
one thread, oneDNN off (the script sets torch.backends.mkldnn.enabled = False): gemma4.h's bf16 mode
reproduces ATen's summation orders (docs/bf16.md), as torch runs them on an AVX2-only CPU.

Usage (repository root): venv/bin/python tools/make_vision_goldens.py [--out data/vision]
       ATEN_CPU_CAPABILITY=avx2 venv/bin/python tools/make_vision_goldens.py --bf16 [--out data/vision]
"""

import json
import os
import shutil

import numpy as np
import PIL
import PIL.features
import torch
from PIL import Image
from safetensors.torch import save_file
from tokenizers import AddedToken, Tokenizer

import golden_common  # noqa: E402

golden_common.pin_versions()

from transformers import (  # noqa: E402
    Gemma4AudioFeatureExtractor,
    Gemma4Config,
    Gemma4ForConditionalGeneration,
    Gemma4ImageProcessor,
    Gemma4ImageProcessorPil,
    Gemma4Processor,
    Gemma4TextConfig,
    Gemma4VideoProcessor,
    Gemma4VisionConfig,
    PreTrainedTokenizerFast,
)

torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)

SL, FU = "sliding_attention", "full_attention"
TAP_ROWS = 32
LOGIT_STRIDE = 11
MM_TOKENS = ["<|image>", "<|image|>", "<image|>", "<|audio>", "<|audio|>", "<audio|>", "<|video|>"]
PATCH, POOL, MAX_SOFT = 4, 2, 70

TEXT_BASE = dict(
    vocab_size=520, hidden_size=32, intermediate_size=48, num_attention_heads=4, head_dim=16, global_head_dim=32,
    rms_norm_eps=1e-6, final_logit_softcapping=30.0, sliding_window=8, max_position_embeddings=512,
    rope_parameters={
        SL: {"rope_type": "default", "rope_theta": 10_000.0},
        FU: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
    },
)
VISION_BASE = dict(
    hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
    head_dim=8, patch_size=PATCH, pooling_kernel_size=POOL, position_embedding_size=48, rms_norm_eps=1e-6,
)

MODELS = [
    dict(name="e2b_mm", seed=2901,
         text=dict(num_hidden_layers=6, layer_types=[SL, SL, FU, SL, SL, FU], num_key_value_heads=1,
                   num_kv_shared_layers=2, use_double_wide_mlp=True, hidden_size_per_layer_input=8,
                   vocab_size_per_layer_input=520, attention_k_eq_v=False, num_global_key_value_heads=None),
         vision=dict(use_clipped_linears=True, standardize=False, rope_parameters={"rope_type": "default", "rope_theta": 100.0})),
    dict(name="31b_mm", seed=2902,
         text=dict(num_hidden_layers=4, layer_types=[SL, SL, SL, FU], num_key_value_heads=2, attention_k_eq_v=True,
                   num_global_key_value_heads=1, hidden_size_per_layer_input=0, num_kv_shared_layers=0,
                   use_bidirectional_attention="vision", sliding_window=12),
         vision=dict(use_clipped_linears=False, standardize=True, rope_parameters={"rope_type": "axial", "rope_theta": 50.0})),
]


def make_tokenizer(src):
    tk = Tokenizer.from_file(src)
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in MM_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>",
        extra_special_tokens=dict(image_token="<|image|>", boi_token="<|image>", eoi_token="<image|>",
                                  audio_token="<|audio|>", boa_token="<|audio>", eoa_token="<audio|>"))


def make_processor(tok):
    kw = dict(patch_size=PATCH, max_soft_tokens=MAX_SOFT, pooling_kernel_size=POOL)
    return Gemma4Processor(feature_extractor=Gemma4AudioFeatureExtractor(), image_processor=Gemma4ImageProcessor(**kw),
                           tokenizer=tok, video_processor=Gemma4VideoProcessor(**kw), image_seq_length=MAX_SOFT)


def make_images():
    rng = np.random.default_rng(29)

    def smooth(h, w, c):  # a smooth picture plus noise: resizing has structure to get right
        y, x = np.mgrid[0:h, 0:w]
        base = [128 + 100 * np.sin(x / (3 + k) + y / (5 + 2 * k) + k) for k in range(c)]
        img = np.stack(base, -1) + rng.normal(0, 30, (h, w, c))
        return np.clip(np.rint(img), 0, 255).astype(np.uint8)

    a = smooth(37, 50, 3)
    b = smooth(64, 64, 3)
    c = smooth(40, 60, 4)
    c[..., 3] = np.clip(np.linspace(0, 255, 60)[None, :] + rng.normal(0, 40, (40, 60)), 0, 255).astype(np.uint8)
    c[:5, :, 3] = 0    # fully transparent rows
    c[-5:, :, 3] = 255  # fully opaque rows
    d = smooth(77, 101, 3)  # processor only: shrinks (56 x 72)
    e = smooth(6, 200, 4)   # processor only: an extreme aspect ratio, RGBA (8 x 280)
    return [a, b, c, d, e]


CASES = [  # (text, images by index)
    ("Look at <|image|> and say", [0]),
    ("<|image|> is square", [1]),
    ("Alpha <|image|>: what", [2]),
    ("First <|image|> then <|image|> end", [0, 1]),
]


def randomize(model, seed):
    def rule(name, leaf, shape, t, normal, uniform):
        v = golden_common.decoder_value(name, leaf, shape, normal, uniform)
        if v is not None:
            return v
        if leaf in ("input_min", "output_min"):
            return -uniform(shape, 0.4, 1.2)  # finite bounds that clip the tails
        if leaf in ("input_max", "output_max"):
            return uniform(shape, 0.4, 1.2)
        if leaf == "std_bias":
            return normal(shape, 0.5)
        if leaf == "std_scale":
            return uniform(shape, 0.5, 2.0)
        if name.endswith("position_embedding_table"):
            return normal(shape, 0.5)
        if len(shape) == 0 or not t.dtype.is_floating_point:
            return None
        return normal(shape, 0.2 if "vision_tower" in name or "embed_vision" in name else 0.1)

    golden_common.random_init(model, seed, rule, buffers=lambda name: True,
                              skip=lambda name: "inv_freq" in name or name.endswith("embed_scale"))


TAP_MODULES_LAYER = ["input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn",
                     "post_attention_layernorm", "pre_feedforward_layernorm", "mlp.gate_proj", "mlp.up_proj", "mlp",
                     "post_feedforward_layernorm", ""]


def record_taps(model, inputs, n_real):
    vt = model.model.vision_tower
    names = ["patch_embedder"]
    for i in range(len(vt.encoder.layers)):
        names += [f"encoder.layers.{i}" + (f".{m}" if m else "") for m in TAP_MODULES_LAYER]
    mods = dict(vt.named_modules())
    out, hooks = {}, []

    def grab(key, first_only):
        def hook(_m, _i, o):
            h = o[0] if isinstance(o, (tuple, list)) else o
            if key in out:  # a second call (several images): keep the first image's
                return
            out[key] = h[0].detach().float().clone() if first_only else h.detach().float().clone()
        return hook

    for n in names:
        hooks.append(mods[n].register_forward_hook(grab("tap." + n, True)))
    hooks.append(mods["pooler"].register_forward_hook(grab("tap_pooler_raw", True)))
    hooks.append(model.model.embed_vision.register_forward_hook(grab("tap.embed_vision", False)))
    try:
        with torch.no_grad():
            model.model.get_image_features(inputs["pixel_values"], inputs["image_position_ids"])
    finally:
        for h in hooks:
            h.remove()
    res = {}
    for k, v in out.items():
        if k == "tap_pooler_raw":
            continue
        if k == "tap.embed_vision":  # after pooling: every soft token
            res[k] = v.contiguous()
            continue
        assert v.shape[0] >= TAP_ROWS and n_real >= TAP_ROWS, (k, v.shape)
        res[k] = v[:TAP_ROWS].contiguous()
    return res


BF16_TAP_ROWS = 16
BF16_MODELS = ["e2b_mm", "31b_mm"]  # the two tower configurations (26b_mm's is 31b_mm's with another theta)


def bf16_goldens(out):
    """The tower in bf16 on the committed models and pixel values (see the top comment: --bf16)."""
    from safetensors.torch import load_file
    cap = torch.backends.cpu.get_cpu_capability()
    assert cap == "AVX2", f"the bf16 goldens need torch's AVX2 kernels (ATEN_CPU_CAPABILITY=avx2), not {cap}"
    pg = load_file(os.path.join(out, "processor.safetensors"))
    vg = load_file(os.path.join(out, "video.safetensors"))
    max_patches = MAX_SOFT * POOL * POOL
    pv_v = vg["pixel_values.v0"]  # [F, n_real, 3 p^2]: the real rows; the processor pads with zeros at (-1, -1)
    F, n_real = pv_v.shape[0], pv_v.shape[1]
    pvv = torch.zeros(F, max_patches, pv_v.shape[2], dtype=torch.float32)
    posv = torch.full((F, max_patches, 2), -1, dtype=torch.int64)
    pvv[:, :n_real] = pv_v
    posv[:, :n_real] = vg["positions.v0"].long()
    lines = []
    # oneDNN off: on a CPU with AVX-512 torch hands bf16 matmuls (F.linear, bmm) above 16^3 multiply-adds
    # to oneDNN, whose summation order is its own; without it (or on an AVX2-only CPU, where torch never
    # uses oneDNN for bf16) they run ATen's kernels, the orders gemma4.h's bf16 mode reproduces
    torch.backends.mkldnn.enabled = False
    for name in BF16_MODELS:
        mdir = os.path.join(out, name)
        model = Gemma4ForConditionalGeneration.from_pretrained(mdir, dtype=torch.bfloat16, attn_implementation="eager").eval()
        vt = model.model.vision_tower
        assert vt.encoder.rotary_emb.inv_freq.dtype == torch.float32
        gold = {}
        names = ["patch_embedder"] + [f"encoder.layers.{i}" + (f".{m}" if m else "")
                                      for i in range(len(vt.encoder.layers)) for m in TAP_MODULES_LAYER]
        mods, taps, hooks = dict(vt.named_modules()), {}, []

        def grab(key):
            def hook(_m, _i, o):
                h = o[0] if isinstance(o, (tuple, list)) else o
                taps[key] = h.detach().clone()
            return hook

        for n in names:
            hooks.append(mods[n].register_forward_hook(grab("tap." + n)))
        try:
            for k in range(3):  # image k is case k's (one image each)
                pv, pos = pg[f"pixel_values.{k}"], pg[f"positions.{k}"].long()
                assert pv.shape[0] == 1
                with torch.no_grad():
                    feats = model.model.get_image_features(pv, pos)
                gold[f"soft.{k}"] = torch.cat(list(feats.pooler_output), 0).contiguous()
                assert gold[f"soft.{k}"].dtype == torch.bfloat16
                if k == 0:
                    for key, v in taps.items():
                        gold[key] = v[0, :BF16_TAP_ROWS].contiguous()
                    gold["tap.vision_tower"] = feats.last_hidden_state.contiguous()
        finally:
            for h in hooks:
                h.remove()
        with torch.no_grad():
            vf = model.model.get_video_features(pvv, posv, torch.tensor([F])).pooler_output
        gold["soft.v0"] = torch.cat(list(vf), 0).contiguous()
        g32 = load_file(os.path.join(mdir, "golden.safetensors"))
        ids0 = pg["ids.0"].long()[None]
        with torch.no_grad():
            res = model(input_ids=ids0, pixel_values=pg["pixel_values.0"], image_position_ids=pg["positions.0"].long(),
                        mm_token_type_ids=pg["mm_types.0"].long()[None], use_cache=False)
        gold["logits.0"] = res.logits[0, g32["logit_rows.0"].long()].contiguous()
        assert all(v.dtype == torch.bfloat16 for v in gold.values())
        save_file(gold, os.path.join(mdir, "bf16.safetensors"))
        with torch.no_grad():  # how far bf16 is from the float32 goldens (for the docs)
            m32 = Gemma4ForConditionalGeneration.from_pretrained(mdir, dtype=torch.float32, attn_implementation="eager").eval()
            s32 = torch.cat(list(m32.model.get_image_features(pg["pixel_values.0"], pg["positions.0"].long()).pooler_output), 0)
        d = (gold["soft.0"].float() - s32).abs().max().item() / s32.abs().max().item()
        lines.append(f"model {name}: {len(gold)} tensors; image 0's bf16 soft tokens against float32: max |d| {d:.3g} "
                     f"of max |soft|; video v0: {gold['soft.v0'].shape[0]} soft tokens")
        print(lines[-1])
    with open(os.path.join(out, "BF16_VERSIONS.txt"), "w") as f:
        f.write(golden_common.versions("torch", "transformers", "safetensors", "numpy",
                                       torch=f"{torch.__version__} (cpu capability {cap}, 1 thread)") +
                f"command ATEN_CPU_CAPABILITY=avx2 venv/bin/python tools/make_vision_goldens.py --bf16 (oneDNN off)\n"
                f"goldens: the committed models loaded with from_pretrained(dtype=torch.bfloat16, "
                f"attn_implementation=eager), the committed pixel values\n")
        for s_ in lines:
            f.write(s_ + "\n")


def build_model(spec, ids_of, out, init=None):
    """spec's tiny model (TEXT_BASE and VISION_BASE with spec's changes), randomized from its seed (then
    init(model), where given), saved bfloat16 to out/<name> (a fresh folder: config.json and
    model.safetensors). Its folder, text config and Gemma4Config."""
    tcfg = dict(TEXT_BASE)
    tcfg.update(spec["text"])
    vcfg = dict(VISION_BASE)
    vcfg.update(spec["vision"])
    cfg = Gemma4Config(text_config=Gemma4TextConfig(**tcfg), vision_config=Gemma4VisionConfig(**vcfg), audio_config=None,
                       boi_token_id=ids_of["<|image>"], eoi_token_id=ids_of["<image|>"],
                       image_token_id=ids_of["<|image|>"], video_token_id=ids_of["<|video|>"],
                       boa_token_id=ids_of["<|audio>"], eoa_token_index=ids_of["<audio|>"],
                       audio_token_id=ids_of["<|audio|>"])
    torch.manual_seed(spec["seed"])
    model = Gemma4ForConditionalGeneration(cfg).eval()
    randomize(model, spec["seed"])
    if init:
        init(model)
    mdir = os.path.join(out, spec["name"])
    if os.path.isdir(mdir):
        shutil.rmtree(mdir)
    model.to(torch.bfloat16).save_pretrained(mdir)
    for f in os.listdir(mdir):
        if f not in ("config.json", "model.safetensors"):
            os.remove(os.path.join(mdir, f))
    return mdir, tcfg, cfg


def main():
    args = golden_common.parse_args("data/vision",
                                    bf16="write only the bf16 goldens (bf16.safetensors), from the committed models")
    if args.bf16:
        bf16_goldens(args.out)
        return

    tok = make_tokenizer("data/tokenizer/tokenizer.json")
    ids_of = {t: tok.convert_tokens_to_ids(t) for t in MM_TOKENS}
    proc = make_processor(tok)
    pdir = os.path.join(args.out, "processor")
    if os.path.isdir(pdir):
        shutil.rmtree(pdir)
    proc.save_pretrained(pdir)
    for f in os.listdir(pdir):  # only what the processor needs
        if f not in ("processor_config.json", "tokenizer.json", "tokenizer_config.json"):
            os.remove(os.path.join(pdir, f))
    pil_proc = Gemma4ImageProcessorPil(patch_size=PATCH, max_soft_tokens=MAX_SOFT, pooling_kernel_size=POOL)

    images = make_images()
    pimg = [Image.fromarray(a, "RGBA" if a.shape[2] == 4 else "RGB") for a in images]
    # image files for the CLI's decoders: images 0 (RGB) and 2 (RGBA) as PNG, image 0 as JPEG
    idir = os.path.join(args.out, "images")
    os.makedirs(idir, exist_ok=True)
    pimg[0].save(os.path.join(idir, "a.png"), optimize=False)
    pimg[2].save(os.path.join(idir, "c.png"), optimize=False)
    pimg[0].save(os.path.join(idir, "a.jpg"), quality=90)
    jpeg_pixels = np.array(Image.open(os.path.join(idir, "a.jpg")).convert("RGB"))
    assert np.array_equal(np.array(Image.open(os.path.join(idir, "a.png"))), images[0])
    assert np.array_equal(np.array(Image.open(os.path.join(idir, "c.png"))), images[2])
    pg = {f"image.{k}": torch.from_numpy(a.astype(np.int16)) for k, a in enumerate(images)}
    case_inputs, backends = [], []
    for c, (text, idx) in enumerate(CASES):
        inp = proc(text=[text], images=[[pimg[i] for i in idx]], return_tensors="pt")
        case_inputs.append(inp)
        if c < 3:  # case 3's images are cases 0 and 1's (checked), not stored twice
            pg[f"pixel_values.{c}"] = inp["pixel_values"].float().contiguous()
        else:
            assert torch.equal(inp["pixel_values"], torch.cat([case_inputs[0]["pixel_values"], case_inputs[1]["pixel_values"]]))
        pg[f"positions.{c}"] = inp["image_position_ids"].to(torch.int32).contiguous()
        pg[f"ids.{c}"] = inp["input_ids"][0].to(torch.int32).contiguous()
        pg[f"mm_types.{c}"] = inp["mm_token_type_ids"][0].to(torch.int32).contiguous()
        pil = pil_proc([pimg[i] for i in idx], return_tensors="pt")
        assert torch.equal(pil["image_position_ids"], inp["image_position_ids"])
        d = (pil["pixel_values"] - inp["pixel_values"]).abs()
        backends.append(f"case {c}: S {inp['input_ids'].shape[1]}  PIL backend against torchvision: max |d| "
                        f"{d.max().item() * 255:.3f}/255; {(d > 0.5 / 255).float().mean().item() * 100:.2f}% of values differ "
                        f"by >= 1/255, {((d > 0) & (d < 1e-6)).float().mean().item() * 100:.2f}% in the last bits only")
        print(backends[-1])
    pg["jpeg_pixels.a"] = torch.from_numpy(jpeg_pixels.astype(np.int16))  # what PIL decodes images/a.jpg to
    for k in (3, 4):  # images for the processor alone: the real patches' rows only
        x = proc.image_processor([pimg[k]], return_tensors="pt")
        real = int((x["image_position_ids"][0, :, 0] >= 0).sum())
        pg[f"pixel_values_x.{k}"] = x["pixel_values"][0, :real].float().contiguous()
        pg[f"positions_x.{k}"] = x["image_position_ids"][0, :real].to(torch.int32).contiguous()
        print(f"image {k}: {images[k].shape} -> {real} patches")
    save_file(pg, os.path.join(args.out, "processor.safetensors"))

    summary = []
    for spec in MODELS:
        mdir, tcfg, cfg = build_model(spec, ids_of, args.out)
        model = Gemma4ForConditionalGeneration.from_pretrained(mdir, dtype=torch.float32, attn_implementation="eager").eval()

        gold = {}
        for c, inp in enumerate(case_inputs):
            with torch.no_grad():
                feats = model.model.get_image_features(inp["pixel_values"], inp["image_position_ids"]).pooler_output
                out = model(**inp, use_cache=False, output_hidden_states=True)
            soft = torch.cat(list(feats), 0)
            S = inp["input_ids"].shape[1]
            assert soft.shape[0] == int((inp["input_ids"] == cfg.image_token_id).sum())
            rows = sorted(set(range(0, S, LOGIT_STRIDE)) | {S - 1})
            gold[f"soft.{c}"] = soft.float().contiguous()
            gold[f"logits.{c}"] = out.logits[0, rows].float().contiguous()
            gold[f"logit_rows.{c}"] = torch.tensor(rows, dtype=torch.int32)
            if c == 0:
                gold["norm.0"] = out.hidden_states[-1][0].float().contiguous()
            # the bidirectional mask must matter where the config asks for it (and nowhere else)
            nomm = {k: v for k, v in inp.items() if k != "mm_token_type_ids"}
            with torch.no_grad():
                causal = model(**nomm, use_cache=False).logits
            diff = (causal - out.logits).abs().max().item()
            bidir = tcfg.get("use_bidirectional_attention") == "vision"
            assert (diff > 1e-3) == bidir, (spec["name"], c, diff)
            summary.append(f"model {spec['name']} case {c}: S {S} soft {soft.shape[0]} max|logit| "
                           f"{out.logits.abs().max().item():.3f}  causal-vs-bidirectional max|d| {diff:.3g}")
            print(summary[-1])
        n_real0 = int((case_inputs[0]["image_position_ids"][0, :, 0] >= 0).sum())
        gold.update(record_taps(model, case_inputs[0], n_real0))
        with torch.no_grad():
            vt = model.model.vision_tower(pixel_values=case_inputs[0]["pixel_values"],
                                          pixel_position_ids=case_inputs[0]["image_position_ids"])
        gold["tap.vision_tower"] = vt.last_hidden_state.float().contiguous()
        save_file(gold, os.path.join(mdir, "golden.safetensors"))

    pillow = f"{PIL.__version__} (libjpeg-turbo {PIL.features.version('libjpeg_turbo')}, zlib {PIL.features.version('zlib')})"
    golden_common.write_versions(os.path.join(args.out, "VERSIONS.txt"), golden_common.IMAGE_STACK,
                                 "venv/bin/python tools/make_vision_goldens.py",
                                 ["goldens float32 CPU, attn_implementation=eager, torch.set_num_threads(1); models stored "
                                  "bfloat16, reloaded float32; processor: torchvision backend (the PIL backend, "
                                  "Gemma4ImageProcessorPil, compared below)"] + backends + summary, pillow=pillow)


if __name__ == "__main__":
    main()
