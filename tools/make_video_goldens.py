#!/usr/bin/env python3
"""Golden data for gemma4.h's video path and a 26B-style (MoE) vision model, from transformers 5.23.0.

Reuses tools/make_vision_goldens.py's tiny models (data/vision/e2b_mm, 31b_mm: loaded, not rebuilt), its
processor (data/vision/processor: Gemma4Processor.from_pretrained, torchvision backend) and its images, and adds:

    data/vision/video.safetensors             the processor's side
        video.0          I16 [8, 18, 26, 3]  a video of 8 RGB frames (smooth, moving, noisy)
        pixel_values.v<c> F32 [F, n_real, 3 p^2]  pixel_values_videos of case c: the real patches of each frame
                                                 (the rest is zero padding, its positions (-1, -1), as the script checks)
        positions.v<c>   I32 [F, n_real, 2]       video_position_ids (x, y) of those patches
        ids.v<c>         I32 [S]                 input_ids (the timestamps, <|image>, <|video|> runs, <image|>)
        mm_types.v<c>    I32 [S]                 mm_token_type_ids
        pixel_values.n, positions.n  frame 3 alone (do_sample_frames=False) with image_mean [0.5, 0.4, 0.3] and
                         image_std [0.2, 0.25, 0.3]: the fused normalisation with other values (no model runs it)
    data/vision/images/b.png, images/video/f1.png, f7.png   case v1's image and frames as files (the CLI's test)
    data/vision/video_cases.txt               sample_frames (default_sample_indices_fn) and
                                              replace_video_token's timestamps on edge cases
    data/vision/<model>/video.safetensors     e2b_mm, 31b_mm, 26b_mm
        soft.v<c>        F32 [n_soft, H]  the case's soft tokens in prompt order (get_image_features /
                                          get_video_features pooler_output, concatenated)
        logits.v<c>      F32 [R, V]       logits of rows logit_rows.v<c> (a stride through the prompt + the last)
        logit_rows.v<c>  I32 [R]
    data/vision/26b_mm/config.json, model.safetensors, golden.safetensors
        a 26B-style model (MoE decoder: enable_moe_block, attention_k_eq_v, bidirectional vision attention;
        the tower standardizes, axial RoPE), golden.safetensors with make_vision_goldens.py's keys for its
        image cases 0-3 (soft, logits, norm.0, the tower taps of case 0)
    data/vision/VIDEO_VERSIONS.txt

Cases: v0 = "Watch <|video|> and tell" with video 0 (metadata fps 0.08, 8 frames; the processor samples
num_frames=3: frames 0, 2, 5 at 00:00, 00:25, 01:02); v1 = "<|image|> and <|video|> end" with image 1
(64x64) and frames 1 and 7 of video 0 passed pre-sampled (do_sample_frames=False, no metadata: transformers
assumes 24 fps, both stamps 00:00).

float32 CPU, attn_implementation="eager", experts_implementation="eager", torch.set_num_threads(1).

Usage (repository root): venv/bin/python tools/make_video_goldens.py [--out data/vision]
"""

import argparse
import os
import sys

import numpy as np
import safetensors
import torch
from PIL import Image
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_vision_goldens as mvg  # noqa: E402  (asserts the versions, sets the threads)

from transformers import (  # noqa: E402
    Gemma4ForConditionalGeneration,
    Gemma4Processor,
)
from transformers.video_utils import VideoMetadata  # noqa: E402

SL, FU = mvg.SL, mvg.FU
NORM_MEAN, NORM_STD = [0.5, 0.4, 0.3], [0.2, 0.25, 0.3]
MOE = dict(name="26b_mm", seed=2903,
           text=dict(num_hidden_layers=4, layer_types=[SL, SL, SL, FU], num_key_value_heads=2, attention_k_eq_v=True,
                     num_global_key_value_heads=1, hidden_size_per_layer_input=0, num_kv_shared_layers=0,
                     use_bidirectional_attention="vision", sliding_window=12, enable_moe_block=True, num_experts=4,
                     top_k_experts=2, moe_intermediate_size=16),
           vision=dict(use_clipped_linears=False, standardize=True,
                       rope_parameters={"rope_type": "axial", "rope_theta": 100.0}))


def make_video():
    rng = np.random.default_rng(2904)
    f, h, w = 8, 18, 26
    t, y, x = np.mgrid[0:f, 0:h, 0:w]
    chans = [128 + 100 * np.sin((x - 2 * t) / (3 + k) + (y + t) / (4 + k) + k) for k in range(3)]
    v = np.stack(chans, -1) + rng.normal(0, 25, (f, h, w, 3))
    return np.clip(np.rint(v), 0, 255).astype(np.uint8)


def real_rows(pv, pos):
    """The real patches of every frame; checks that the rest is zero padding at (-1, -1)."""
    real = (pos[..., 0] >= 0)
    n = int(real[0].sum())
    assert bool(real[:, :n].all()) and not bool(real[:, n:].any())
    assert bool((pos[:, n:] == -1).all()) and bool((pv[:, n:] == 0).all())
    return pv[:, :n].float().contiguous(), pos[:, :n].to(torch.int32).contiguous()


def sample_table(vp):
    """What preprocess samples with the processor's num_frames and fps set to the table's (0 = None):
    'sample TOTAL VIDEO_FPS NUM_FRAMES FPS : indices' or ': error'."""
    lines = []
    cases = [(8, 0.08, 3, 0), (10, 2.0, 4, 0), (10, 0, 10, 0), (7, 0, 3, 0), (100, 30.0, 32, 0), (5, 0, 6, 0),
             (90, 30.0, 0, 2.0), (90, 29.97, 0, 1.0), (10, 24.0, 0, 1.0), (3, 30.0, 0, 60.0), (1, 1.0, 0, 0.5),
             (64, 0, 0, 0), (64, 25.0, 0, 0), (4, 0, 2, 1.0), (4, 24.0, 2, 1.0), (12, 0, 0, 1.0), (1000, 29.97, 0, 0.7)]
    saved = vp.num_frames, vp.fps
    for total, vfps, nf, fps in cases:
        md = VideoMetadata(total_num_frames=total, fps=vfps if vfps > 0 else None)
        vp.num_frames, vp.fps = (nf if nf > 0 else None), (fps if fps > 0 else None)
        try:  # as preprocess calls it: sample_frames(metadata, num_frames=self.num_frames, fps=self.fps)
            idx = vp.sample_frames(md, num_frames=vp.num_frames, fps=vp.fps)
            res = " ".join(str(int(i)) for i in idx)
        except ValueError:
            res = "error"
        lines.append(f"sample {total} {vfps!r} {nf} {fps!r} : {res}")
    vp.num_frames, vp.fps = saved
    return lines


def stamp_table(proc):
    """replace_video_token's text for one soft token per frame: 'stamp FPS IDX... : text'."""
    lines = []
    cases = [(24.0, [0, 1, 23, 24, 1439, 1440, 86399, 86400]), (0.08, [0, 2, 5]), (0.1, [599, 600, 3, 7]),
             (29.97, [1798, 1799, 107892, 107893]), (3.0, [179, 180, 181]), (1e-3, [1, 59, 3600])]
    for fps, idx in cases:
        md = VideoMetadata(total_num_frames=max(idx) + 1, fps=fps, frames_indices=idx)
        text = proc.replace_video_token({"num_soft_tokens_per_video": [1], "video_metadata": [md]}, 0)
        stamps = text.replace(proc.boi_token + proc.video_token + proc.eoi_token, "|")
        lines.append(f"stamp {fps!r} {' '.join(map(str, idx))} : {stamps}")
    md = VideoMetadata(total_num_frames=3, fps=None, frames_indices=[0, 30, 59])  # no fps: transformers takes 24
    text = proc.replace_video_token({"num_soft_tokens_per_video": [1], "video_metadata": [md]}, 0)
    lines.append(f"stamp 0 0 30 59 : {text.replace(proc.boi_token + proc.video_token + proc.eoi_token, '|')}")
    return lines


def build_moe(out, ids_of):
    def router(model):  # the router as make_goldens.py draws it
        g = torch.Generator().manual_seed(MOE["seed"] + 1)
        for name, t in sorted(model.named_parameters(), key=lambda x: x[0]):
            with torch.no_grad():
                if name.endswith("router.proj.weight"):
                    t.copy_(torch.randn(t.shape, generator=g) * 2.0)  # spread router logits: clear top-k margins
                elif name.endswith("router.scale") or name.endswith("router.per_expert_scale"):
                    t.copy_(0.5 + torch.rand(t.shape, generator=g))

    return mvg.build_model(MOE, ids_of, out, router)[1]


def load(mdir):
    return Gemma4ForConditionalGeneration.from_pretrained(mdir, dtype=torch.float32, attn_implementation="eager",
                                                          experts_implementation="eager").eval()


def moe_margin(model, inp):
    gaps, hooks = [], []

    def hook(mod, _inp, output):
        k = mod.config.top_k_experts
        top = torch.topk(output[0], k + 1, dim=-1).values
        gaps.append(float((top[:, k - 1] - top[:, k]).min()))

    for layer in model.model.language_model.layers:
        hooks.append(layer.router.register_forward_hook(hook))
    with torch.no_grad():
        model(**inp, use_cache=False)
    for h in hooks:
        h.remove()
    return min(gaps)


def soft_of(model, inp):
    parts = []  # in prompt order: each case has its image before its video
    with torch.no_grad():
        if "pixel_values" in inp:
            parts += list(model.model.get_image_features(inp["pixel_values"], inp["image_position_ids"]).pooler_output)
        if "pixel_values_videos" in inp:
            parts += list(model.model.get_video_features(inp["pixel_values_videos"], inp["video_position_ids"],
                                                         inp["num_frames_per_video"]).pooler_output)
    return torch.cat(parts, 0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="data/vision")
    args = ap.parse_args()

    proc = Gemma4Processor.from_pretrained(os.path.join(args.out, "processor"))
    assert type(proc.image_processor).__name__ == "Gemma4ImageProcessor"  # the torchvision backend
    vp = proc.video_processor
    assert (vp.patch_size, vp.max_soft_tokens, vp.pooling_kernel_size, vp.num_frames) == (4, 70, 2, 32)
    tok = proc.tokenizer
    ids_of = {t: tok.convert_tokens_to_ids(t) for t in mvg.MM_TOKENS}
    images = mvg.make_images()
    pimg = [Image.fromarray(a, "RGBA" if a.shape[2] == 4 else "RGB") for a in images]
    video = make_video()

    inputs, notes = {}, []
    inputs["v0"] = proc(text=["Watch <|video|> and tell"], videos=[video],
                        video_metadata=[{"total_num_frames": 8, "fps": 0.08}], num_frames=3, return_tensors="pt")
    inputs["v1"] = proc(text=["<|image|> and <|video|> end"], images=[[pimg[1]]], videos=[video[[1, 7]]],
                        do_sample_frames=False, return_tensors="pt")
    pg = {"video.0": torch.from_numpy(video.astype(np.int16))}
    for c, inp in inputs.items():
        pv, pos = real_rows(inp["pixel_values_videos"], inp["video_position_ids"])
        pg[f"pixel_values.{c}"], pg[f"positions.{c}"] = pv, pos
        pg[f"ids.{c}"] = inp["input_ids"][0].to(torch.int32).contiguous()
        pg[f"mm_types.{c}"] = inp["mm_token_type_ids"][0].to(torch.int32).contiguous()
        text = tok.decode(inp["input_ids"][0]).replace("<|video|>", "").replace("<|image|>", "")
        notes.append(f"case {c}: S {inp['input_ids'].shape[1]}, frames {pv.shape[0]} x {pv.shape[1]} patches; text without "
                     f"the <|video|> and <|image|> runs: {text!r}")
        print(notes[-1])
    # the rescale: normalize((x), 0, 1 / rescale_factor) = float32(x) / 255, not the images' x * float32(1 / 255)
    x = torch.from_numpy(video[[1, 7]]).permute(0, 3, 1, 2).float()
    assert bool((x.flatten() == x.flatten()).all())
    k = torch.arange(256, dtype=torch.float32)
    div, mul = k / torch.tensor(255.0), k * torch.tensor(1 / 255, dtype=torch.float32)
    notes.append(f"video rescale: float32(k) / 255 (fused into normalize); differs from the image processor's "
                 f"k * float32(1/255) in the last bit for {int((div != mul).sum())} of 256 values")
    got = set(torch.unique(pg["pixel_values.v0"]).tolist())
    assert got <= set(div.tolist()), "the video's pixel values are not float32(k) / 255"
    # RGBA frames: transformers cannot infer the channel axis of a 4-channel array (gemma4.h refuses them too)
    rgba = np.concatenate([video[[1, 7]], np.full((2, 18, 26, 1), 255, np.uint8)], -1)
    try:
        vp(videos=[rgba], do_sample_frames=False, return_tensors="pt")
        raise AssertionError("RGBA frames were accepted")
    except ValueError as e:
        notes.append(f"RGBA frames: transformers refuses them ({e})")
    # each frame is resized alone, as gemma4.h does (the 4-D resize of the whole video gives the same)
    one = vp(videos=[video[[1]]], do_sample_frames=False, return_tensors="pt")
    assert torch.equal(one["pixel_values_videos"][0], inputs["v1"]["pixel_values_videos"][0])
    # another normalisation (processor only): mean and std per channel, fused with the rescale
    o = vp(videos=[video[[3]]], do_sample_frames=False, image_mean=NORM_MEAN, image_std=NORM_STD, return_tensors="pt")
    pg["pixel_values.n"], pg["positions.n"] = real_rows(o["pixel_values_videos"], o["video_position_ids"])
    save_file(pg, os.path.join(args.out, "video.safetensors"))
    # case v1's inputs as files, for the command line: image 1 and the two frames as PNG (read back identical)
    vdir = os.path.join(args.out, "images", "video")
    os.makedirs(vdir, exist_ok=True)
    pimg[1].save(os.path.join(args.out, "images", "b.png"), optimize=False)
    for i in (1, 7):
        Image.fromarray(video[i], "RGB").save(os.path.join(vdir, f"f{i}.png"), optimize=False)
        assert np.array_equal(np.array(Image.open(os.path.join(vdir, f"f{i}.png"))), video[i])
    assert np.array_equal(np.array(Image.open(os.path.join(args.out, "images", "b.png"))), images[1])
    with open(os.path.join(args.out, "video_cases.txt"), "w") as f:
        f.write("# tools/make_video_goldens.py: Gemma4VideoProcessor.sample_frames (total_num_frames video_fps num_frames fps,\n"
                "# 0 = None) and Gemma4Processor.replace_video_token's stamps (fps frame_indices; '|' stands for a frame's run)\n")
        for line in sample_table(vp) + stamp_table(proc):
            f.write(line + "\n")

    tcfg_moe = build_moe(args.out, ids_of)
    summary = []
    for name in ("e2b_mm", "31b_mm", "26b_mm"):
        model = load(os.path.join(args.out, name))
        gold = {}
        for c, inp in inputs.items():
            soft = soft_of(model, inp)
            n_ph = int(((inp["input_ids"] == model.config.image_token_id) | (inp["input_ids"] == model.config.video_token_id)).sum())
            assert soft.shape[0] == n_ph, (soft.shape, n_ph)
            with torch.no_grad():
                out = model(**inp, use_cache=False)
                causal = model(**{k: v for k, v in inp.items() if k != "mm_token_type_ids"}, use_cache=False).logits
            S = inp["input_ids"].shape[1]
            rows = sorted(set(range(0, S, mvg.LOGIT_STRIDE)) | {S - 1})
            gold[f"soft.{c}"] = soft.float().contiguous()
            gold[f"logits.{c}"] = out.logits[0, rows].float().contiguous()
            gold[f"logit_rows.{c}"] = torch.tensor(rows, dtype=torch.int32)
            diff = (causal - out.logits).abs().max().item()
            bidir = model.config.text_config.use_bidirectional_attention == "vision"
            assert (diff > 1e-3) == bidir, (name, c, diff)
            line = (f"model {name} case {c}: S {S} soft {soft.shape[0]} max|logit| {out.logits.abs().max().item():.3f}  "
                    f"causal-vs-bidirectional max|d| {diff:.3g}")
            if name == "26b_mm":
                line += f"  min router top-k margin {moe_margin(model, inp):.3g}"
            summary.append(line)
            print(line)
        save_file(gold, os.path.join(args.out, name, "video.safetensors"))

        if name == "26b_mm":  # the image cases of make_vision_goldens.py, with its keys
            pgi = safetensors.torch.load_file(os.path.join(args.out, "processor.safetensors"))
            gold = {}
            case_inputs = []
            for c, (text, idx) in enumerate(mvg.CASES):
                inp = proc(text=[text], images=[[pimg[i] for i in idx]], return_tensors="pt")
                assert torch.equal(inp["input_ids"][0].to(torch.int32), pgi[f"ids.{c}"])
                if c < 3:
                    assert torch.equal(inp["pixel_values"].float(), pgi[f"pixel_values.{c}"])
                case_inputs.append(inp)
                with torch.no_grad():
                    feats = model.model.get_image_features(inp["pixel_values"], inp["image_position_ids"]).pooler_output
                    out = model(**inp, use_cache=False, output_hidden_states=True)
                    causal = model(**{k: v for k, v in inp.items() if k != "mm_token_type_ids"}, use_cache=False).logits
                soft = torch.cat(list(feats), 0)
                S = inp["input_ids"].shape[1]
                rows = sorted(set(range(0, S, mvg.LOGIT_STRIDE)) | {S - 1})
                gold[f"soft.{c}"] = soft.float().contiguous()
                gold[f"logits.{c}"] = out.logits[0, rows].float().contiguous()
                gold[f"logit_rows.{c}"] = torch.tensor(rows, dtype=torch.int32)
                if c == 0:
                    gold["norm.0"] = out.hidden_states[-1][0].float().contiguous()
                diff = (causal - out.logits).abs().max().item()
                assert diff > 1e-3, diff
                summary.append(f"model 26b_mm image case {c}: S {S} soft {soft.shape[0]} max|logit| "
                               f"{out.logits.abs().max().item():.3f}  causal-vs-bidirectional max|d| {diff:.3g}  "
                               f"min router top-k margin {moe_margin(model, inp):.3g}")
                print(summary[-1])
            n_real0 = int((case_inputs[0]["image_position_ids"][0, :, 0] >= 0).sum())
            gold.update(mvg.record_taps(model, case_inputs[0], n_real0))
            with torch.no_grad():
                vt = model.model.vision_tower(pixel_values=case_inputs[0]["pixel_values"],
                                              pixel_position_ids=case_inputs[0]["image_position_ids"])
            gold["tap.vision_tower"] = vt.last_hidden_state.float().contiguous()
            save_file(gold, os.path.join(args.out, name, "golden.safetensors"))

    gc = mvg.golden_common
    gc.write_versions(os.path.join(args.out, "VIDEO_VERSIONS.txt"), gc.IMAGE_STACK,
                      "venv/bin/python tools/make_video_goldens.py (after tools/make_vision_goldens.py)",
                      ["goldens float32 CPU, attn_implementation=eager, experts_implementation=eager, torch.set_num_threads(1); "
                       "26b_mm stored bfloat16, reloaded float32; processor: data/vision/processor (torchvision backend)",
                       f"26b_mm text config: {tcfg_moe}"] + notes + summary)


if __name__ == "__main__":
    main()
