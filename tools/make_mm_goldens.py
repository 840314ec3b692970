#!/usr/bin/env python3
"""Golden data for the CLI's images and audio together: several files per prompt, the chat template
with image and audio content items, and the processor's placeholder expansion.

Builds a tiny random-weight Gemma4ForConditionalGeneration with BOTH towers (an E2B-style text model
with PLE and shared KV, a vision tower with clipped linears, an audio conformer) WITH transformers,
saves it as a real checkpoint (stored bfloat16), reloads it in float32 and records, from the reloaded
model and the real Gemma4Processor (the tokenizer and processor settings of data/vision/processor,
torchvision image backend, Gemma4AudioFeatureExtractor) with Google's released Gemma 4 E2B chat
template (data/templates/e2b/chat_template.jinja):

    data/mm/e2b_av/   config.json, model.safetensors, tokenizer.json, tokenizer_config.json,
                      processor_config.json, chat_template.jinja  (a model directory for build/gemma4)
    data/mm/chat.json       the chat case's messages as the CLI reads them ({"type": "image"} items)
    data/mm/chat.txt        apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    data/mm/chat_greedy.txt tokenizer.decode(chat.greedy, skip_special_tokens=True): what generate prints
    data/mm/golden.safetensors
        prompt.text_ids   I32  tokenizer(PROMPT).input_ids (<bos> + the text, one id per placeholder)
        prompt.ids        I32  Gemma4Processor(text=PROMPT, images=[a.png, c.png], audio=[clip_b]).input_ids
        prompt.logits     F32 [R, V]  the model's logits at rows prompt.rows
        prompt.rows       I32 [R]     every LOGIT_STRIDE-th row and the last
        chat.text_ids     I32  the rendered chat tokenized without expansion (add_special_tokens=False)
        chat.ids          I32  Gemma4Processor.apply_chat_template(messages with the image and clips,
                               tokenize=True, add_generation_prompt=True).input_ids
        chat.logits, chat.rows   as for the prompt
        chat.greedy       I32 [NEW]   model.generate(do_sample=False, max_new_tokens=NEW) after chat.ids

Inputs (files already in the repository): data/vision/images/a.png (50x37 RGB), c.png (60x40 RGBA),
data/tiny/e2b_audio/clip_a.wav (16130 samples PCM16), clip_b.wav (7000 samples float32).
The prompt interleaves audio and images (audio, image, image); the chat has image, audio, audio.

The Gemma 3 tokenizer in ../shared/data has no <|image|> / <|audio|> tokens (it has
<start_of_image>), so the tiny tokenizer with Gemma 4's added tokens is used.

float32 CPU, attn_implementation="eager", torch.set_num_threads(1), deterministic seeds.
Usage (repository root): venv/bin/python tools/make_mm_goldens.py [--out data/mm]
"""

import argparse
import json
import os
import shutil
import wave

import numpy as np
import torch
from PIL import Image
from safetensors.torch import save_file

import golden_common  # tools/, the script's folder, is on the path

golden_common.pin_versions()

from transformers import (  # noqa: E402
    Gemma4AudioConfig,
    Gemma4Config,
    Gemma4ForConditionalGeneration,
    Gemma4Processor,
    Gemma4TextConfig,
    Gemma4VisionConfig,
)

golden_common.deterministic()

SEED = 2929
SL, FU = "sliding_attention", "full_attention"
LOGIT_STRIDE = 7
NEW = 4
PROMPT = "Hear <|audio|> see <|image|> and <|image|> then"
CHAT = {"messages": [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Listen:"}, {"type": "audio"},
                                 {"type": "text", "text": "what now?"}, {"type": "audio"}]},
]}
CHAT_IMAGES = ["a.png"]
CHAT_AUDIO = ["clip_a.wav", "clip_b.wav"]

TEXT = dict(
    vocab_size=520, hidden_size=32, intermediate_size=48, num_attention_heads=4, head_dim=16, global_head_dim=32,
    rms_norm_eps=1e-6, final_logit_softcapping=30.0, sliding_window=8, max_position_embeddings=512,
    num_hidden_layers=4, layer_types=[SL, FU, SL, FU], num_key_value_heads=1, num_kv_shared_layers=2,
    use_double_wide_mlp=True, hidden_size_per_layer_input=8, vocab_size_per_layer_input=520,
    attention_k_eq_v=False, num_global_key_value_heads=None,
    rope_parameters={
        SL: {"rope_type": "default", "rope_theta": 10_000.0},
        FU: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
    },
)
VISION = dict(
    hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
    head_dim=8, patch_size=4, pooling_kernel_size=2, position_embedding_size=48, rms_norm_eps=1e-6,
    use_clipped_linears=True, standardize=False, rope_parameters={"rope_type": "default", "rope_theta": 100.0},
)
AUDIO = dict(
    hidden_size=24, num_hidden_layers=2, num_attention_heads=3, subsampling_conv_channels=[128, 4],
    conv_kernel_size=5, output_proj_dims=20, residual_weight=0.37, attention_chunk_size=12,
    attention_context_left=13, attention_context_right=0, rms_norm_eps=1e-3, use_clipped_linears=True,
    attention_logit_cap=4.0, gradient_clipping=2.5,
)


def randomize(model):
    """Every norm weight, scalar and bound random (not its init value)."""
    g = torch.Generator().manual_seed(SEED)

    def normal(shape, std):
        return torch.randn(shape, generator=g, dtype=torch.float32) * std

    def uniform(shape, lo, hi):
        return lo + (hi - lo) * torch.rand(shape, generator=g, dtype=torch.float32)

    items = list(model.named_parameters()) + list(model.named_buffers())
    seen = set()
    for name, t in sorted(items, key=lambda x: x[0]):
        if id(t) in seen or "inv_freq" in name or name.endswith("embed_scale") or name.endswith("softcap"):
            continue
        seen.add(id(t))
        shape = tuple(t.shape)
        leaf = name.rsplit(".", 1)[-1]
        audio = "audio_tower" in name or "embed_audio" in name
        if name.endswith("layer_scalar"):
            v = uniform(shape, 0.5, 1.5)
        elif leaf in ("input_min", "output_min"):
            v = -uniform(shape, 0.8, 2.0) if audio else -uniform(shape, 0.4, 1.2)
        elif leaf in ("input_max", "output_max"):
            v = uniform(shape, 0.8, 2.0) if audio else uniform(shape, 0.4, 1.2)
        elif name.endswith("per_dim_scale"):
            v = normal(shape, 0.7)
        elif name.endswith("language_model.norm.weight"):
            v = uniform(shape, 3.0, 5.0)
        elif "norm" in name and leaf == "weight" and len(shape) == 1:
            v = uniform(shape, 0.5, 1.5)
        elif name.endswith("embed_tokens.weight"):
            v = normal(shape, 0.1)
        elif name.endswith("embed_tokens_per_layer.weight"):
            v = normal(shape, 0.5)
        elif name.endswith("position_embedding_table"):
            v = normal(shape, 0.5)
        elif len(shape) == 0 or not t.dtype.is_floating_point:
            continue
        elif audio:
            v = normal(shape, 0.1) if leaf == "bias" else normal(shape, 1.0 / np.sqrt(int(np.prod(shape[1:]))))
        else:
            v = normal(shape, 0.2 if "vision_tower" in name or "embed_vision" in name else 0.1)
        with torch.no_grad():
            t.copy_(v.to(t.dtype))


def read_wav(path):  # PCM16 as k / 32768 (soundfile's reading), float32 as stored
    with open(path, "rb") as f:
        b = f.read()
    if b[20:22] == b"\x03\x00":  # WAVE_FORMAT_IEEE_FLOAT (the data chunk is last)
        k = b.index(b"data")
        n = int.from_bytes(b[k + 4:k + 8], "little")
        return np.frombuffer(b[k + 8:k + 8 + n], "<f4").astype(np.float32)
    with wave.open(path) as w:
        assert w.getframerate() == 16000 and w.getnchannels() == 1 and w.getsampwidth() == 2
        return (np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / np.float32(32768.0)).astype(np.float32)


def rows_of(S):
    return sorted(set(range(0, S, LOGIT_STRIDE)) | {S - 1})


# a chat with a video item: Gemma4Processor's apply_chat_template(tokenize=True) with two pre-sampled
# frames (a.png and its mirror image, data/tiny/unified_like/processor/a_mirror.png), no metadata (24 fps)
VIDEO_CHAT = {"messages": [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": "Watch"}, {"type": "video"},
                                 {"type": "text", "text": "and hear"}, {"type": "audio"}]}]}
VIDEO_FRAMES = ["data/vision/images/a.png", "data/tiny/unified_like/processor/a_mirror.png"]


def make_video_golden(out):
    """video_chat.json and video_golden.safetensors (add-only, from the committed e2b_av): the chat's
    template text ids (video.text_ids), the processor's ids (video.ids), the model's logits on a few rows
    (video.logits, video.rows) and its greedy tokens (video.greedy)."""
    mdir = os.path.join(out, "e2b_av")
    proc = Gemma4Processor.from_pretrained(mdir)
    tok = proc.tokenizer
    frames = [np.array(Image.open(f).convert("RGB")) for f in VIDEO_FRAMES]
    video = np.stack(frames)
    clip = read_wav(os.path.join("data/tiny/e2b_audio", "clip_b.wav"))
    msgs = json.loads(json.dumps(VIDEO_CHAT["messages"]))
    for item in msgs[1]["content"]:
        if item["type"] == "video":
            item["video"] = video
        elif item["type"] == "audio":
            item["audio"] = clip
    text = proc.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    cin = proc.apply_chat_template(msgs, tokenize=True, return_dict=True, add_generation_prompt=True, return_tensors="pt",
                                   do_sample_frames=False)
    again = proc(text=[text], videos=[video], audio=[clip], add_special_tokens=False, do_sample_frames=False,
                 return_tensors="pt")
    assert torch.equal(again["input_ids"], cin["input_ids"]), "apply_chat_template = render, then __call__"
    model = Gemma4ForConditionalGeneration.from_pretrained(mdir, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        lg = model(**cin, use_cache=False).logits[0]
        gen = model.generate(**cin, do_sample=False, max_new_tokens=NEW, min_new_tokens=NEW)
    S = cin["input_ids"].shape[1]
    rows = rows_of(S)
    gold = {"video.text_ids": torch.tensor(tok(text, add_special_tokens=False)["input_ids"], dtype=torch.int32),
            "video.ids": cin["input_ids"][0].to(torch.int32), "video.logits": lg[rows].float(),
            "video.rows": torch.tensor(rows, dtype=torch.int32), "video.greedy": gen[0, S:].to(torch.int32)}
    assert int(gold["video.greedy"][0]) == int(lg[-1].argmax())
    save_file({k: v.contiguous() for k, v in sorted(gold.items())}, os.path.join(out, "video_golden.safetensors"))
    with open(os.path.join(out, "video_chat.json"), "w") as f:
        json.dump(VIDEO_CHAT, f, indent=1)
        f.write("\n")
    note = (f"video chat: {gold['video.text_ids'].numel()} text ids -> {S} ids (2 frames of 37x50, clip_b), max|logit| "
            f"{lg.abs().max().item():.3f}, greedy {gold['video.greedy'].tolist()}")
    print(note)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    with open(os.path.join(out, "VIDEO_VERSIONS.txt"), "w") as f:
        f.write(f"torch {torch.__version__}\ntransformers {transformers.__version__}\ntorchvision {torchvision.__version__}\n"
                f"pillow {PIL.__version__}\ntokenizers {tokenizers.__version__}\nnumpy {np.__version__}\n"
                f"python {platform.python_version()}\nplatform {platform.platform()}\ndate {now}\n"
                "command venv/bin/python tools/make_mm_goldens.py --video-only\n"
                "Gemma4Processor.from_pretrained(e2b_av).apply_chat_template(tokenize=True, do_sample_frames=False); "
                "e2b_av float32 CPU, eager, one thread\n" + note + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="data/mm")
    ap.add_argument("--video-only", action="store_true", help="only video_chat.json, video_golden.safetensors")
    args = ap.parse_args()
    if args.video_only:
        make_video_golden(args.out)
        return
    mdir = os.path.join(args.out, "e2b_av")
    shutil.rmtree(mdir, ignore_errors=True)
    os.makedirs(mdir)

    proc = Gemma4Processor.from_pretrained("data/vision/processor")
    template = open("data/templates/e2b/chat_template.jinja").read()
    proc.chat_template = template
    tok = proc.tokenizer
    ids_of = {t: tok.convert_tokens_to_ids(t) for t in
              ["<|image>", "<|image|>", "<image|>", "<|audio>", "<|audio|>", "<audio|>", "<|video|>"]}
    images = {k: Image.open(os.path.join("data/vision/images", k)) for k in ("a.png", "c.png")}
    for im in images.values():
        im.load()
    clips = {k: read_wav(os.path.join("data/tiny/e2b_audio", k)) for k in ("clip_a.wav", "clip_b.wav")}
    assert len(clips["clip_a.wav"]) == 16130 and len(clips["clip_b.wav"]) == 7000

    cfg = Gemma4Config(text_config=Gemma4TextConfig(**TEXT), vision_config=Gemma4VisionConfig(**VISION),
                       audio_config=Gemma4AudioConfig(**AUDIO),
                       boi_token_id=ids_of["<|image>"], eoi_token_id=ids_of["<image|>"],
                       image_token_id=ids_of["<|image|>"], video_token_id=ids_of["<|video|>"],
                       boa_token_id=ids_of["<|audio>"], eoa_token_index=ids_of["<audio|>"],
                       audio_token_id=ids_of["<|audio|>"])
    torch.manual_seed(SEED)
    model = Gemma4ForConditionalGeneration(cfg).eval()
    randomize(model)
    golden_common.save_bf16(model, mdir)
    for f in ("tokenizer.json", "tokenizer_config.json", "processor_config.json"):
        shutil.copy(os.path.join("data/vision/processor", f), os.path.join(mdir, f))
    shutil.copy("data/templates/e2b/chat_template.jinja", os.path.join(mdir, "chat_template.jinja"))
    model = Gemma4ForConditionalGeneration.from_pretrained(mdir, dtype=torch.float32, attn_implementation="eager").eval()

    gold, notes = {}, []

    # 1. a raw prompt: audio, image, image
    inp = proc(text=[PROMPT], images=[[images["a.png"], images["c.png"]]], audio=[clips["clip_b.wav"]], return_tensors="pt")
    with torch.no_grad():
        out = model(**inp, use_cache=False)
    S = inp["input_ids"].shape[1]
    rows = rows_of(S)
    gold["prompt.text_ids"] = torch.tensor(tok(PROMPT)["input_ids"], dtype=torch.int32)
    gold["prompt.ids"] = inp["input_ids"][0].to(torch.int32)
    gold["prompt.logits"] = out.logits[0, rows].float()
    gold["prompt.rows"] = torch.tensor(rows, dtype=torch.int32)
    notes.append(f"prompt: {gold['prompt.text_ids'].numel()} text ids -> {S} ids, max|logit| {out.logits.abs().max().item():.3f}")

    # 2. the chat: the template's text, then the processor (image a.png, clips a and b)
    msgs = json.loads(json.dumps(CHAT["messages"]))
    it_img, it_aud = iter(CHAT_IMAGES), iter(CHAT_AUDIO)
    for m in msgs:
        if isinstance(m["content"], list):
            for item in m["content"]:
                if item["type"] == "image":
                    item["image"] = images[next(it_img)]
                elif item["type"] == "audio":
                    item["audio"] = clips[next(it_aud)]
    text = proc.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    cin = proc.apply_chat_template(msgs, tokenize=True, return_dict=True, add_generation_prompt=True, return_tensors="pt")
    # the same as rendering, then __call__ on the text with the files
    again = proc(text=[text], images=[[images[k] for k in CHAT_IMAGES]], audio=[clips[k] for k in CHAT_AUDIO],
                 add_special_tokens=False, return_tensors="pt")
    assert torch.equal(again["input_ids"], cin["input_ids"])
    with torch.no_grad():
        out = model(**cin, use_cache=False)
        gen = model.generate(**cin, do_sample=False, max_new_tokens=NEW, min_new_tokens=NEW)
    S = cin["input_ids"].shape[1]
    rows = rows_of(S)
    gold["chat.text_ids"] = torch.tensor(tok(text, add_special_tokens=False)["input_ids"], dtype=torch.int32)
    gold["chat.ids"] = cin["input_ids"][0].to(torch.int32)
    gold["chat.logits"] = out.logits[0, rows].float()
    gold["chat.rows"] = torch.tensor(rows, dtype=torch.int32)
    gold["chat.greedy"] = gen[0, S:].to(torch.int32)
    assert int(gold["chat.greedy"][0]) == int(out.logits[0, -1].argmax())
    notes.append(f"chat: {gold['chat.text_ids'].numel()} text ids -> {S} ids, max|logit| {out.logits.abs().max().item():.3f}, "
                 f"greedy {gold['chat.greedy'].tolist()}")

    save_file({k: v.contiguous() for k, v in sorted(gold.items())}, os.path.join(args.out, "golden.safetensors"))
    with open(os.path.join(args.out, "chat.json"), "w") as f:
        json.dump(CHAT, f, indent=1)
        f.write("\n")
    with open(os.path.join(args.out, "chat.txt"), "w") as f:
        f.write(text)
    stops = {tok.convert_tokens_to_ids(t) for t in ("<eos>", "<turn|>")}
    assert not stops & set(gold["chat.greedy"].tolist())  # generate would stop there
    with open(os.path.join(args.out, "chat_greedy.txt"), "w", encoding="utf-8") as f:
        f.write(tok.decode(gold["chat.greedy"].tolist(), skip_special_tokens=True))
    with open(os.path.join(args.out, "VERSIONS.txt"), "w") as f:
        f.write(golden_common.versions("torch", "transformers", "torchvision", "pillow", "safetensors", "tokenizers", "numpy") +
                "command venv/bin/python tools/make_mm_goldens.py\n"
                "goldens float32 CPU, attn_implementation=eager, torch.set_num_threads(1); model stored bfloat16, "
                "reloaded float32; processor: torchvision backend\n")
        for n in notes:
            f.write(n + "\n")
    for n in notes:
        print(n)
    make_video_golden(args.out)
    for root, _, files in os.walk(args.out):
        for f in sorted(files):
            print(f"{os.path.join(root, f):40s} {os.path.getsize(os.path.join(root, f)):8d} bytes")


if __name__ == "__main__":
    main()
