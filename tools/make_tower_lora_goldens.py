#!/usr/bin/env python3
"""LoRA on the towers' linears: goldens written by peft itself (issue 29, item 9).

peft cannot wrap a Gemma4ClippableLinear (it refuses the module type), so an
adapter reaches a clipped linear through its inner nn.Linear: target_modules
"q_proj.linear" (peft's suffix match) or a regex. The tower's plain nn.Linear
modules (the patch embedder's input_proj, the audio tower's relative_k_proj and
output_proj, the embedders' embedding_projection) are targeted by their names.

For each case: the tiny model is loaded with transformers (float32, eager),
wrapped with get_peft_model(LoraConfig(...)), every lora_A and lora_B set to
random NON-ZERO values (seeded; stored as bf16 values), saved with
save_pretrained into data/lora/<case>/, then reloaded on a fresh base with
PeftModel.from_pretrained (the path a user takes) and checked against the
in-memory model; the goldens come from the reloaded one:

  data/lora/<case>/golden.safetensors
    vision cases: soft.0   F32 [n, H]  get_image_features(pixel_values.0, positions.0).pooler_output
                                       (data/vision/processor.safetensors' case 0), the image's soft tokens
                  base.0   F32 [n, H]  the same without the adapter (the test checks the adapter matters)
    audio cases:  soft.a   F32 [n, H]  get_audio_features(a.input_features, a.input_features_mask)'s
                                       pooler_output, padding stripped (data/tiny/e2b_audio/golden.safetensors)
                  base.a   F32 [n, H]  the same without the adapter

float32 CPU, eval (no dropout), attn_implementation="eager", torch.set_num_threads(1).

--bf16 writes only the bf16 goldens (the committed adapters and models are read, nothing else is
rewritten): each case's model loaded with from_pretrained(dtype=torch.bfloat16), the committed
adapter with PeftModel.from_pretrained (peft's default autocast_adapter_dtype=True: the adapter
float32 on the bf16 model, as a user loads it; docs/lora.md "bf16"):

  data/lora/<case>/bf16.safetensors
    soft.0 / soft.a   F32 [n, H]  the soft tokens as above, bf16 values (stored as float32)
    base.0 / base.a   F32 [n, H]  the same bf16 model without the adapter

torch's AVX2 kernels (ATEN_CPU_CAPABILITY=avx2; the script checks), oneDNN off, one thread, as the
towers' bf16 goldens (tools/make_vision_goldens.py --bf16).

Usage (from the repository root): venv/bin/python tools/make_tower_lora_goldens.py
       ATEN_CPU_CAPABILITY=avx2 venv/bin/python tools/make_tower_lora_goldens.py --bf16
"""

import argparse
import os

import peft
import torch
import transformers
from safetensors.torch import load_file, save_file

import golden_common  # tools/, the script's folder, is on the path

assert torch.__version__.startswith("2.15"), torch.__version__
assert transformers.__version__ == "5.23.0", transformers.__version__
assert peft.__version__ == "0.21.2", peft.__version__

from peft import LoraConfig, PeftModel, get_peft_model  # noqa: E402
from transformers import Gemma4ForConditionalGeneration  # noqa: E402

torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)

A_STD, B_STD = 0.2, 0.2
CASES = [
    ("vision_e2b", os.path.join("data", "vision", "e2b_mm"), "vision",
     dict(r=2, lora_alpha=4,
          target_modules=r".*vision_tower\.encoder\.layers\.[0-9]+\.(self_attn\.(q_proj|v_proj|o_proj)|mlp\.down_proj)\.linear"
                         r"|.*patch_embedder\.input_proj|.*embed_vision\.embedding_projection|.*language_model.*\.q_proj"),
     "E2B-style tower (clipped linears): q/v/o and down through .linear, input_proj, embed_vision, and the text q_proj"),
    ("vision_31b", os.path.join("data", "vision", "31b_mm"), "vision",
     dict(r=4, lora_alpha=6, use_rslora=True, target_modules=["k_proj.linear", "gate_proj.linear", "up_proj.linear"]),
     "31B-style tower (no clipping, standardize): k/gate/up by suffix, rslora (the text model's k_proj is no .linear)"),
    ("audio_e2b", os.path.join("data", "tiny", "e2b_audio"), "audio",
     dict(r=2, lora_alpha=3,
          target_modules=r".*audio_tower\.layers\.[0-9]+\.(self_attn\.(q_proj|post)|feed_forward1\.ffw_layer_1|"
                         r"lconv1d\.linear_start)\.linear|.*relative_k_proj|.*audio_tower\.output_proj|"
                         r".*embed_audio\.embedding_projection|.*subsample_conv_projection\.input_proj_linear"),
     "the audio tower: clipped q/post/ffw_layer_1/linear_start, relative_k_proj, input_proj_linear, output_proj "
     "(with its bias), embed_audio"),
]


def load(path, dtype=torch.float32):
    return Gemma4ForConditionalGeneration.from_pretrained(path, dtype=dtype, attn_implementation="eager").eval()


def soft(model, kind):
    m = model.get_base_model() if hasattr(model, "get_base_model") else model
    with torch.no_grad():
        if kind == "vision":
            pg = load_file(os.path.join("data", "vision", "processor.safetensors"))
            out = m.model.get_image_features(pg["pixel_values.0"], pg["positions.0"].long()).pooler_output
            return torch.cat(list(out), 0).float().contiguous()
        g = load_file(os.path.join("data", "tiny", "e2b_audio", "golden.safetensors"))
        out = m.model.get_audio_features(g["a.input_features"][None], g["a.input_features_mask"][None].bool(),
                                         return_dict=True)
        keep = out.attention_mask[0].bool()
        return out.pooler_output[0][keep].float().contiguous()


def make(name, src, kind, kwargs, seed, out_root):
    out = os.path.join(out_root, name)
    base = load(src)
    base_soft = soft(base, kind)
    pm = get_peft_model(base, LoraConfig(lora_dropout=0.0, **kwargs))
    golden_common.lora_init(pm, seed, torch.bfloat16, A_STD, B_STD)
    pm.eval()
    mem = soft(pm, kind)
    golden_common.save_adapter(pm, out)
    model = PeftModel.from_pretrained(load(src), out)
    model.eval()
    got = soft(model, kind)
    assert torch.equal(got, mem), "reloaded adapter differs from the in-memory one"
    key = "0" if kind == "vision" else "a"
    save_file({f"soft.{key}": got, f"base.{key}": base_soft}, os.path.join(out, "golden.safetensors"))
    saved = load_file(os.path.join(out, "adapter_model.safetensors"))
    modules = sorted({k.rsplit(".lora_", 1)[0] for k in saved})
    size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    return (f"case {name:12s} model {src:22s} modules {len(modules):3d} tensors {len(saved):3d} "
            f"max|soft - base| {(got - base_soft).abs().max().item():.3g}  bytes {size}")


def bf16_goldens(out_root):
    """The committed adapters on the bf16 models (see the top comment: --bf16)."""
    cap = torch.backends.cpu.get_cpu_capability()
    assert cap == "AVX2", f"the bf16 goldens need torch's AVX2 kernels (ATEN_CPU_CAPABILITY=avx2), not {cap}"
    torch.backends.mkldnn.enabled = False  # ATen's bf16 matmuls, the orders gemma4.h's bf16 mode reproduces
    lines = [golden_common.versions("torch", "transformers", "peft", "safetensors", "numpy",
                                    torch=f"{torch.__version__} (cpu capability {cap}, 1 thread, oneDNN off)").rstrip("\n"),
             "command ATEN_CPU_CAPABILITY=avx2 venv/bin/python tools/make_tower_lora_goldens.py --bf16",
             "goldens: each case's model from_pretrained(dtype=torch.bfloat16, attn_implementation=eager), its committed "
             "adapter through PeftModel.from_pretrained (autocast_adapter_dtype=True: float32 adapter)"]
    for name, src, kind, _, _ in CASES:
        out = os.path.join(out_root, name)
        base = soft(load(src, torch.bfloat16), kind)
        model = PeftModel.from_pretrained(load(src, torch.bfloat16), out).eval()
        assert all(p.dtype == torch.float32 for n, p in model.named_parameters() if "lora_" in n)
        got = soft(model, kind)
        key = "0" if kind == "vision" else "a"
        save_file({f"soft.{key}": got, f"base.{key}": base}, os.path.join(out, "bf16.safetensors"))
        f32 = load_file(os.path.join(out, "golden.safetensors"))[f"soft.{key}"]
        line = (f"case {name:12s} bf16 soft tokens {tuple(got.shape)}: max|soft - base| {(got - base).abs().max().item():.3g}, "
                f"against the float32 golden {(got - f32).abs().max().item() / f32.abs().max().item():.3g} of max|soft|")
        print(line, flush=True)
        lines.append(line)
    with open(os.path.join(out_root, "TOWER_BF16_VERSIONS.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bf16", action="store_true", help="write only the bf16 goldens (bf16.safetensors)")
    if ap.parse_args().bf16:
        bf16_goldens(os.path.join("data", "lora"))
        return
    out_root = os.path.join("data", "lora")
    lines = [golden_common.versions("torch", "transformers", "peft", "safetensors", "numpy").rstrip("\n"),
             f"torch cpu capability {torch.backends.cpu.get_cpu_capability()}",
             "command venv/bin/python tools/make_tower_lora_goldens.py",
             f"goldens float32 CPU, eval, eager attention, 1 thread; lora_A ~ N(0, {A_STD}^2), lora_B ~ N(0, {B_STD}^2) "
             "(bf16 values), seeded per case"]
    for i, (name, src, kind, kw, what) in enumerate(CASES):
        line = make(name, src, kind, kw, 2000 + i, out_root)
        print(line, flush=True)
        lines.append(line + "  # " + what)
    with open(os.path.join(out_root, "TOWER_VERSIONS.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
