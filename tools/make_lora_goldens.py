#!/usr/bin/env python3
"""LoRA adapter goldens for gemma4.h, written by peft itself.

For each case below: the tiny model data/tiny/<model> is loaded with transformers
(float32, eager), wrapped with peft's get_peft_model(LoraConfig(...)), every lora_A
and lora_B set to random NON-ZERO values (seeded; peft initialises B to zero), and the
adapter saved with save_pretrained into data/lora/<case>/ (adapter_config.json +
adapter_model.safetensors, exactly as peft writes them). The goldens are then taken
from a FRESH base model with the saved adapter loaded by PeftModel.from_pretrained
(the path a user takes), and checked against the in-memory model first:

    data/lora/<case>/golden.safetensors
        input_ids     I32 [S]      the tiny model's golden input ids
        logits        F32 [S, 128] one full forward, after soft-capping: the first 128 columns
                                   of the vocabulary only (the data budget). The hidden size is
                                   32, 48 or 64, so 128 logits x = E_128 h (before the soft-cap, a
                                   monotone map) still pin the final hidden state h; the rest of
                                   lm_head is not adapted and the base goldens cover it
        greedy_ids    I32 [6 + 8]  prompt input_ids[:6] + 8 tokens of generate(do_sample=False)
        labels        I32 [S]      input_ids with -100 at 3 and 9
        loss          F32 [1]      model(input_ids, labels=labels).loss
        grad.<name>   F32          dL/d every adapter tensor, named as in adapter_model.safetensors
                                   (cases with grads=True; the others keep only loss)

float32 CPU, eval() (no dropout), attn_implementation="eager",
experts_implementation="eager", torch.set_num_threads(1).

Two bf16 goldens, tools/hf_dump.py --dtype bfloat16 --adapter data/lora/e2b_all on
e2b_like (12 tokens, a few taps and the logits), the base model in bfloat16:
  data/lora/e2b_all/bf16_dump.safetensors: the adapter loaded by
    PeftModel.from_pretrained, peft's default autocast_adapter_dtype=True, so the
    adapter's weights are float32 and peft's lora.Linear.forward casts x up to them
    and the sum back to bf16 (result.to(torch_result_dtype)). gemma4.h's bf16 mode
    rounds at exactly those points.
  data/lora/e2b_all/bf16_adapter_dump.safetensors: hf_dump --adapter-bf16, the
    adapter's weights then cast to bf16 (a bf16 training run's adapter, or
    autocast_adapter_dtype=False): lora_A, lora_B and the scaling run in bf16.
    gemma4.h's bf16 mode with g4_session_config.lora_bf16 (--adapter-bf16).
`build/gemma4 compare` and `logits --bf16 --adapter` are tested against both bit for bit.

Usage (from the repository root):
    venv/bin/python tools/make_lora_goldens.py [--out data/lora] [--only case ...]
"""

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys

import numpy as np
import peft
import safetensors
import torch
import transformers
from safetensors.torch import load_file, save_file

import golden_common  # tools/, the script's folder, is on the path

assert torch.__version__.startswith("2.15"), torch.__version__
assert transformers.__version__ == "5.23.0", transformers.__version__
assert peft.__version__ == "0.21.2", peft.__version__

from peft import LoraConfig, PeftModel, get_peft_model  # noqa: E402
from transformers import AutoModelForCausalLM, Gemma4ForConditionalGeneration  # noqa: E402

torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
       "per_layer_input_gate", "per_layer_projection", "per_layer_model_projection"]

# name, tiny model, LoraConfig arguments, what it covers, whether the gradients are kept, the
# dtype the adapter is saved in (values drawn in that dtype; loaded as float32 by peft)
CASES = [
    ("e2b_all", "e2b_like", dict(r=2, lora_alpha=4, target_modules=ALL),
     "every linear of the text decoder (reader layers have no k_proj/v_proj: skipped)", True, torch.bfloat16),
    ("31b_qv_rslora", "31b_like", dict(r=8, lora_alpha=16, use_rslora=True, target_modules=["q_proj", "v_proj"]),
     "q/v only with rslora on a k_eq_v model (its full layer has no v_proj: skipped)", False, torch.bfloat16),
    ("26b_regex", "26b_like",
     dict(r=4, lora_alpha=6, target_modules=r".*layers\.[0-9]+\.(self_attn\.(k|o)_proj|router\.proj|mlp\.down_proj)"),
     "a regex target_modules on the MoE model, the router's proj among them", True, torch.bfloat16),
    ("plain_layers", "plain",
     dict(r=4, lora_alpha=4, target_modules=["q_proj", "up_proj", "down_proj"], layers_to_transform=[0, 2],
          layers_pattern="layers"),
     "layers_to_transform + layers_pattern", False, torch.float32),
    ("legacy_patterns", "legacy_keys",
     dict(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "o_proj", "gate_proj"],
          rank_pattern={"o_proj": 2, "model.layers.1.mlp.gate_proj": 6}, alpha_pattern={"gate_proj": 3},
          exclude_modules=["model.layers.0.self_attn.q_proj"]),
     "rank_pattern/alpha_pattern and exclude_modules on the legacy-keys model", True, torch.bfloat16),
    ("e4b_multimodal", "e4b_like",
     dict(r=2, lora_alpha=4, target_modules=r".*language_model.*\.(q_proj|v_proj|per_layer_input_gate)"),
     "the multimodal wrapper (model.language_model.*), peft's default gemma4 regex widened", False, torch.bfloat16),
]

A_STD, B_STD = 0.05, 0.05
LOGIT_COLS = 128  # logits kept per token (see the top)
# the bf16 golden: (case, its tiny model, tokens, taps kept by hf_dump --taps)
BF16_DUMP = ("e2b_all", "e2b_like", 12,
             "per_layer_inputs,layers.0.self_attn.q,layers.0.self_attn.k,layers.0.self_attn,layers.0.mlp,"
             "layers.0,layers.7.self_attn,layers.9,norm")


def load_base(path):
    cfg = json.load(open(os.path.join(path, "config.json")))
    cls = Gemma4ForConditionalGeneration if "text_config" in cfg else AutoModelForCausalLM
    kw = dict(dtype=torch.float32, attn_implementation="eager")
    if cfg.get("text_config", cfg).get("enable_moe_block"):
        kw["experts_implementation"] = "eager"
    model = cls.from_pretrained(path, **kw)
    model.eval()
    return model


def logits_of(model, ids):
    with torch.no_grad():
        return model(input_ids=ids[None]).logits[0].float()


def make(name, tiny, kwargs, out_root, seed, with_grads, dtype):
    src = os.path.join("data", "tiny", tiny)
    out = os.path.join(out_root, name)
    gold = load_file(os.path.join(src, "golden.safetensors"))
    ids = gold["input_ids"].long()
    base = load_base(src)
    base_logits = logits_of(base, ids)
    pm = get_peft_model(base, LoraConfig(lora_dropout=0.0, **kwargs))
    golden_common.lora_init(pm, seed, dtype, A_STD, B_STD)
    pm.eval()
    mem_logits = logits_of(pm, ids)
    golden_common.save_adapter(pm, out, dtype)  # bf16 cases: saved as a bf16 training run saves them (values already bf16)
    # the golden: a fresh base + the saved adapter, as a user loads it
    model = PeftModel.from_pretrained(load_base(src), out)  # autocast_adapter_dtype: float32 adapter
    model.eval()
    logits = logits_of(model, ids)
    assert torch.equal(logits, mem_logits), "reloaded adapter differs from the in-memory one"
    with torch.no_grad():
        g = model.generate(input_ids=ids[None, :6], max_new_tokens=8, do_sample=False, min_new_tokens=8)[0]
    labels = ids.clone()
    labels[3] = -100
    labels[9] = -100
    model.zero_grad()
    for n, p in model.named_parameters():
        p.requires_grad_("lora_" in n)
    loss = model(input_ids=ids[None], labels=labels[None]).loss
    loss.backward()
    saved = load_file(os.path.join(out, "adapter_model.safetensors"))
    grads = {}
    for n, p in model.named_parameters():
        if "lora_" in n:
            key = n.replace(".default", "")
            assert key in saved, key
            grads["grad." + key] = p.grad.detach().float().contiguous()
    assert set(k[5:] for k in grads) == set(saved), "gradients do not cover the adapter"
    if not with_grads:
        grads = {}
    save_file({"input_ids": ids.int(), "logits": logits[:, :LOGIT_COLS].contiguous(),
               "greedy_ids": g.int().contiguous(), "labels": labels.int(), "loss": loss.detach().reshape(1),
               **grads}, os.path.join(out, "golden.safetensors"))
    delta = (logits - base_logits).abs().max().item()
    modules = sorted({k.rsplit(".lora_", 1)[0] for k in saved})
    size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    return (f"case {name:16s} model {tiny:12s} modules {len(modules):3d} tensors {len(saved):3d} "
            f"max|logits - base| {delta:.3g}  loss {loss.item():.7f}  greedy {g[6:].tolist()}  bytes {size}")


def bf16_dump(out_root):
    """The bf16 goldens: tools/hf_dump.py --dtype bfloat16 --adapter (peft's PeftModel.from_pretrained path:
    a float32 adapter), and with --adapter-bf16 (the adapter's weights cast to bf16: peft runs it in bf16)."""
    name, tiny, n, taps = BF16_DUMP
    src = os.path.join("data", "tiny", tiny)
    ids = load_file(os.path.join(src, "golden.safetensors"))["input_ids"][:n].tolist()
    lines = []
    for file, extra, what in (("bf16_dump.safetensors", [], "float32 adapter (PeftModel.from_pretrained's default)"),
                              ("bf16_adapter_dump.safetensors", ["--adapter-bf16"], "the adapter's weights cast to bf16")):
        out = os.path.join(out_root, name, file)
        subprocess.run([sys.executable, os.path.join("tools", "hf_dump.py"), src, "--ids", ",".join(map(str, ids)),
                        "--out", out, "--dtype", "bfloat16", "--adapter", os.path.join(out_root, name), "--taps", taps]
                       + extra, check=True)
        lines.append(f"bf16 {name} on {tiny}: {file}, tools/hf_dump.py --dtype bfloat16 --adapter {' '.join(extra)}, "
                     f"{n} tokens, taps {taps}, bytes {os.path.getsize(out)}  # the model in bf16, {what}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join("data", "lora"))
    ap.add_argument("--only", nargs="*")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    lines = [f"torch {torch.__version__}", f"transformers {transformers.__version__}", f"peft {peft.__version__}",
             f"safetensors {safetensors.__version__}", f"numpy {np.__version__}",
             f"python {platform.python_version()}", f"torch cpu capability {torch.backends.cpu.get_cpu_capability()}",
             f"date {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M:%S} UTC",
             "command venv/bin/python tools/make_lora_goldens.py",
             f"goldens float32 CPU, eval, eager attention/experts, 1 thread; logits [S, {LOGIT_COLS}]; lora_A ~ N(0, {A_STD}^2), "
             f"lora_B ~ N(0, {B_STD}^2), seeded per case; labels -100 at 3 and 9"]
    vpath = os.path.join(a.out, "VERSIONS.txt")
    # with --only, the "case"/"bf16" lines of the cases not rebuilt stay as they were (their files
    # are not rewritten); the header is the run's own
    old = open(vpath).read().splitlines() if a.only and os.path.exists(vpath) else []
    kept = {l.split()[1]: l for l in old if l.startswith("case ")}
    kept_bf16 = [l for l in old if l.startswith("bf16 ")]
    for i, (name, tiny, kw, what, with_grads, dtype) in enumerate(CASES):
        if a.only and name not in a.only:
            if name in kept:
                lines.append(kept[name])
            continue
        line = make(name, tiny, kw, a.out, 1000 + i, with_grads, dtype)
        print(line, flush=True)
        lines.append(line + f"  adapter {str(dtype)[6:]}  # " + what)
    if not a.only or BF16_DUMP[0] in a.only:
        line = bf16_dump(a.out)
        print(line, flush=True)
        lines.append(line)
    else:
        lines += kept_bf16
    if a.only:
        lines[lines.index("command venv/bin/python tools/make_lora_goldens.py")] += " --only " + " ".join(a.only)
    with open(vpath, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
