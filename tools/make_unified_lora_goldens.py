#!/usr/bin/env python3
"""LoRA on the 12B unified model's embedders: goldens written by peft itself.

Gemma4UnifiedForConditionalGeneration (gemma4_unified) has no towers: its encoder-free embedders
hold three nn.Linear modules, which peft adapts like any other (named_modules() on
data/tiny/unified_like):

    model.embed_vision.patch_dense                             Linear(Pd -> D), with a bias
    model.embed_vision.multimodal_embedder.embedding_projection Linear(D -> H), no bias
    model.embed_audio.embedding_projection                     Linear(A -> H), no bias

For each case: data/tiny/unified_like loaded with transformers (float32, eager), wrapped with
get_peft_model(LoraConfig(...)), every lora_A and lora_B set to random NON-ZERO values (seeded;
bf16 values, golden_common.lora_init), saved with save_pretrained into data/lora/<case>/, reloaded
on a fresh base with PeftModel.from_pretrained (the path a user takes) and checked against the
in-memory model; the goldens come from the reloaded one, on mm_golden.safetensors' inputs (two
images' merged patches with padding, a clip's frames with a mask):

  data/lora/<case>/golden.safetensors   (float32 model, float32 adapter)
    image_soft  F32 [10, H]  get_image_features(pixel_values, image_position_ids).pooler_output, concatenated
    audio_soft  F32 [4, H]   get_audio_features(input_features, input_features_mask).pooler_output[mask]
    logits      F32 [6, V]   (unified_all_linear only) the logits of golden.safetensors' first 6 input_ids
  data/lora/<case>/bf16.safetensors     the same on the model loaded with dtype=torch.bfloat16 and the
                                        adapter through PeftModel.from_pretrained (autocast_adapter_dtype=True:
                                        the adapter float32), values bf16 (stored as float32)
  data/lora/UNIFIED_VERSIONS.txt        the versions, the command, one line a case

The base model's soft tokens are data/tiny/unified_like's mm_golden (float32) and embed_bf16_golden
(bf16): the test checks the adapter moves them. float32 and bf16 alike run on torch's AVX2 kernels
(ATEN_CPU_CAPABILITY=avx2; the script checks), oneDNN off, one thread, as the other bf16 goldens.

Usage (from the repository root):
    ATEN_CPU_CAPABILITY=avx2 venv/bin/python tools/make_unified_lora_goldens.py
"""

import os

import peft
import torch
from safetensors.torch import load_file, save_file

import golden_common  # tools/, the script's folder, is on the path

golden_common.pin_versions()
assert peft.__version__ == "0.21.2", peft.__version__

from peft import LoraConfig, PeftModel, get_peft_model  # noqa: E402
from transformers import Gemma4UnifiedForConditionalGeneration  # noqa: E402

golden_common.deterministic()

SRC = os.path.join("data", "tiny", "unified_like")
A_STD, B_STD = 0.2, 0.2
CASES = [
    ("unified_embedders", dict(r=3, lora_alpha=5, target_modules=["patch_dense", "embedding_projection"]),
     "the three embedder linears by suffix (patch_dense with its bias, both embedding_projection)"),
    ("unified_all_linear", dict(r=2, lora_alpha=5, use_rslora=True, target_modules="all-linear"),
     "all-linear (the decoder's linears and the embedders'), rslora"),
]
N_LOGITS = 6


def load(dtype):
    return Gemma4UnifiedForConditionalGeneration.from_pretrained(SRC, dtype=dtype, attn_implementation="eager").eval()


def record(model, logits):
    m = model.get_base_model() if hasattr(model, "get_base_model") else model
    g = load_file(os.path.join(SRC, "mm_golden.safetensors"))
    pv, pos = g["pixel_values"], g["image_position_ids"].long()
    feats, fmask = g["input_features"], g["input_features_mask"].bool()
    with torch.no_grad():
        img = m.model.get_image_features(pv, pos, return_dict=True)
        aud = m.model.get_audio_features(feats, fmask, return_dict=True)
        out = {"image_soft": torch.cat(list(img.pooler_output), 0).float().contiguous(),
               "audio_soft": aud.pooler_output[aud.attention_mask].float().contiguous()}
        if logits:
            ids = load_file(os.path.join(SRC, "golden.safetensors"))["input_ids"][:N_LOGITS].long()
            out["logits"] = model(input_ids=ids[None], use_cache=False).logits[0].float().contiguous()
    return out


def make(name, kwargs, seed, out_root):
    out = os.path.join(out_root, name)
    logits = name == "unified_all_linear"
    pm = get_peft_model(load(torch.float32), LoraConfig(lora_dropout=0.0, **kwargs))
    golden_common.lora_init(pm, seed, torch.bfloat16, A_STD, B_STD)
    pm.eval()
    mem = record(pm, logits)
    golden_common.save_adapter(pm, out)
    got = record(PeftModel.from_pretrained(load(torch.float32), out).eval(), logits)
    for k in got:
        assert torch.equal(got[k], mem[k]), f"{k}: the reloaded adapter differs from the in-memory one"
    save_file(got, os.path.join(out, "golden.safetensors"))
    # bf16: the model in torch.bfloat16, the adapter float32 (peft's autocast_adapter_dtype=True)
    model = PeftModel.from_pretrained(load(torch.bfloat16), out).eval()
    assert all(p.dtype == torch.float32 for n, p in model.named_parameters() if "lora_" in n)
    b16 = record(model, logits)
    for k in b16:
        assert torch.equal(b16[k], b16[k].to(torch.bfloat16).float()), k
    save_file(b16, os.path.join(out, "bf16.safetensors"))
    base = load_file(os.path.join(SRC, "mm_golden.safetensors"))
    base16 = load_file(os.path.join(SRC, "embed_bf16_golden.safetensors"))
    saved = load_file(os.path.join(out, "adapter_model.safetensors"))
    modules = sorted({k.rsplit(".lora_", 1)[0] for k in saved})
    emb = [m for m in modules if ".embed_" in m]
    size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    return (f"case {name:18s} modules {len(modules):3d} (embedders: {', '.join(emb)}) tensors {len(saved):3d}; "
            f"max|soft - base| image {(got['image_soft'] - base['image_soft']).abs().max().item():.3g} "
            f"audio {(got['audio_soft'] - base['audio_soft']).abs().max().item():.3g}, "
            f"bf16 image {(b16['image_soft'] - base16['image_soft']).abs().max().item():.3g} "
            f"audio {(b16['audio_soft'] - base16['audio_soft']).abs().max().item():.3g}; bytes {size}")


def main():
    cap = torch.backends.cpu.get_cpu_capability()
    assert cap == "AVX2", f"the goldens need torch's AVX2 kernels (ATEN_CPU_CAPABILITY=avx2), not {cap}"
    torch.backends.mkldnn.enabled = False  # ATen's bf16 matmuls, the orders gemma4.h's bf16 mode reproduces
    out_root = os.path.join("data", "lora")
    lines = [f"goldens CPU, eval, eager attention, 1 thread, torch cpu capability {cap}, oneDNN off; "
             f"lora_A ~ N(0, {A_STD}^2), lora_B ~ N(0, {B_STD}^2) (bf16 values), seeded per case; golden.safetensors "
             "float32, bf16.safetensors the model in torch.bfloat16 with the adapter float32 (autocast_adapter_dtype)"]
    for i, (name, kw, what) in enumerate(CASES):
        line = make(name, kw, 3100 + i, out_root)
        print(line, flush=True)
        lines.append(line + "  # " + what)
    golden_common.write_versions(os.path.join(out_root, "UNIFIED_VERSIONS.txt"),
                                 ("torch", "transformers", "peft", "safetensors", "numpy"),
                                 "ATEN_CPU_CAPABILITY=avx2 venv/bin/python tools/make_unified_lora_goldens.py", lines)


if __name__ == "__main__":
    main()
