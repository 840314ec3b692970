"""What the golden scripts share: the pinned versions, the random init of a tiny model and the
greedy cross-check. Imported by tools/make_goldens.py, make_vision_goldens.py,
make_audio_goldens.py and make_unified_goldens.py (run from the repository root with
venv/bin/python; Python puts tools/ on the path).

The random init is part of every golden: a change here changes the weights of every tiny model,
so keep the order of the draws (tensors sorted by name, each tensor drawn once) and rerun
the scripts if you must change it."""

import argparse
import datetime
import importlib
import os
import platform
import shutil
import tempfile

import torch
import transformers

TORCH_VERSION = "2.15"
TRANSFORMERS_VERSION = "5.23.0"


def pin_versions(transformers_version=TRANSFORMERS_VERSION):
    """The goldens are made with these versions (VERSIONS.txt beside each data folder)."""
    assert torch.__version__.startswith(TORCH_VERSION), torch.__version__
    assert transformers.__version__ == transformers_version, transformers.__version__


def parse_args(out, **only):
    """A golden script's command line: --out DIR (default out; made if missing) and, for each
    name=help of only, a flag --name (underscores as dashes) that makes one part alone."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=out)
    for name, text in only.items():
        ap.add_argument("--" + name.replace("_", "-"), action="store_true", help=text)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    return args


def deterministic():
    """Bit-reproducible CPU reductions: deterministic algorithms, one thread."""
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)


def versions(*names, **text):
    """A VERSIONS.txt's first lines: "name version" for each package of names (pillow: PIL), text[name]
    in place of the version where given, then python, the platform and the date (UTC)."""
    lines = [f"{n} {text[n] if n in text else importlib.import_module('PIL' if n == 'pillow' else n).__version__}"
             for n in names]
    lines += [f"python {platform.python_version()}", f"platform {platform.platform()}",
              f"date {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M:%S')} UTC"]
    return "".join(line + "\n" for line in lines)


IMAGE_STACK = ("torch", "transformers", "torchvision", "pillow", "safetensors", "tokenizers", "numpy")


def write_versions(path, packages, command, lines, **text):
    """A VERSIONS.txt at path: versions(*packages, **text), the command that made the goldens
    (venv/bin/python tools/...), then lines, one a line."""
    with open(path, "w") as f:
        f.write(versions(*packages, **text) + f"command {command}\n")
        for line in lines:
            f.write(line + "\n")


def save_adapter(pm, out, dtype=torch.bfloat16):
    """The peft model pm's adapter, cast to dtype, into the folder out (replaced): only adapter_config.json and
    adapter_model.safetensors (save_pretrained also writes a README)."""
    if os.path.exists(out):
        shutil.rmtree(out)
    with tempfile.TemporaryDirectory() as tmp:
        pm.to(dtype)
        pm.save_pretrained(tmp)
        os.makedirs(out)
        for f in ("adapter_config.json", "adapter_model.safetensors"):
            shutil.copy(os.path.join(tmp, f), os.path.join(out, f))


def lora_init(pm, seed, dtype, a_std, b_std):
    """The adapter of the peft model pm drawn from seed: lora_A ~ N(0, a_std^2), lora_B ~ N(0, b_std^2)
    (not peft's zero B), in parameter order, each value rounded to dtype."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_A" in n:
                p.copy_((torch.randn(p.shape, generator=gen) * a_std).to(dtype).float())
            elif "lora_B" in n:
                p.copy_((torch.randn(p.shape, generator=gen) * b_std).to(dtype).float())


def save_bf16(model, mdir):
    """model in bfloat16 into mdir: its config.json and model.safetensors only (other files there stay)."""
    tmp = mdir + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.to(torch.bfloat16).save_pretrained(tmp)
    for f in ("config.json", "model.safetensors"):
        shutil.move(os.path.join(tmp, f), os.path.join(mdir, f))
    shutil.rmtree(tmp)


def random_init(model, seed, rule, buffers=lambda name: name.endswith("layer_scalar"), skip=lambda name: False):
    """Give the model's parameters (and the buffers `buffers` selects) random values,
    deterministic in seed: tensors in name order, a tied tensor drawn once. For each,
    rule(name, leaf, shape, t, normal, uniform) returns the float32 value, or None to leave it;
    normal(shape, std) and uniform(shape, lo, hi) draw from the one generator."""
    g = torch.Generator().manual_seed(seed)

    def normal(shape, std):
        return torch.randn(shape, generator=g, dtype=torch.float32) * std

    def uniform(shape, lo, hi):
        return lo + (hi - lo) * torch.rand(shape, generator=g, dtype=torch.float32)

    items = list(model.named_parameters()) + [(n, b) for n, b in model.named_buffers() if buffers(n)]
    seen = set()
    for name, t in sorted(items, key=lambda x: x[0]):
        if id(t) in seen or skip(name):
            continue
        seen.add(id(t))
        shape = tuple(t.shape)
        v = rule(name, name.rsplit(".", 1)[-1], shape, t, normal, uniform)
        if v is not None:
            with torch.no_grad():
                t.copy_(v.to(t.dtype))


FINAL_NORM_RANGE = (3.0, 5.0)  # the final norm sets the logit scale (lm_head is the tied embedding)
EMBED_STD = 0.1                # tied lm_head: logits std ~ EMBED_STD * sqrt(hidden)


def decoder_value(name, leaf, shape, normal, uniform):
    """The text decoder's rules (None where none applies): layer scalars and RMSNorm weights
    (used as-is, not 1 + w) around 1 but never their init, the final norm larger, the
    embeddings and the per-layer embeddings."""
    if name.endswith("layer_scalar"):
        return uniform(shape, 0.5, 1.5)
    if name.endswith("language_model.norm.weight") or name == "model.norm.weight":
        return uniform(shape, *FINAL_NORM_RANGE)
    if "norm" in name and leaf == "weight" and len(shape) == 1:
        return uniform(shape, 0.5, 1.5)
    if name.endswith("embed_tokens.weight"):
        return normal(shape, EMBED_STD)
    if name.endswith("embed_tokens_per_layer.weight"):
        return normal(shape, 0.5)
    return None


def record_text(model, tm, input_ids):
    """One cache-free forward of model with hooks on its text model tm: the float32 rows of
    embed, layer.i, final_norm and the logits (the batch's one sequence)."""
    out, hooks = {}, []

    def grab(key):
        def hook(_mod, _inp, output):
            h = output[0] if isinstance(output, (tuple, list)) else output
            out[key] = h[0].detach().float().clone()
        return hook

    hooks.append(tm.embed_tokens.register_forward_hook(grab("embed")))
    for i, layer in enumerate(tm.layers):
        hooks.append(layer.register_forward_hook(grab(f"layer.{i}")))
    hooks.append(tm.norm.register_forward_hook(grab("final_norm")))
    try:
        with torch.no_grad():
            res = model(input_ids=input_ids[None], use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    out["logits"] = res.logits[0].detach().float().clone()
    assert all(f"layer.{i}" in out for i in range(len(tm.layers)))
    return out


def greedy_check(model, prompt, new_tokens):
    """model.generate's greedy continuation of prompt and the raw logits of each step,
    cross-checked against plain argmax over full cache-free forwards; also the smallest
    top-1/top-2 logit gap seen (how far the goldens are from a tie)."""
    gen_cfg = transformers.GenerationConfig(
        do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
        eos_token_id=None, pad_token_id=0, bos_token_id=2,
        return_dict_in_generate=True, output_logits=True,
    )
    with torch.no_grad():
        out = model.generate(prompt[None], generation_config=gen_cfg)
    seq = out.sequences[0]
    step_logits = torch.stack([l[0] for l in out.logits]).float()
    assert seq.shape[0] == prompt.shape[0] + new_tokens, seq.shape
    assert step_logits.shape[0] == new_tokens
    ids, gap = prompt.clone(), float("inf")
    with torch.no_grad():
        for _ in range(new_tokens):
            logits = model(input_ids=ids[None], use_cache=False).logits[0, -1]
            top2 = torch.topk(logits, 2).values
            gap = min(gap, float(top2[0] - top2[1]))
            ids = torch.cat([ids, logits.argmax()[None]])
    assert torch.equal(ids, seq), (ids.tolist(), seq.tolist())
    return seq, step_logits, gap


def record_outputs(modules, fn):
    """Run fn() with a forward hook on each module of `modules` (tap name -> module): returns
    (fn's result, {tap: the module's output as float32 rows [-1, last dim]}). The hooks are
    removed whatever happens. Outputs of a bfloat16 model are bf16 values, exact in float32."""
    taps, hooks = {}, []

    def grab(key):
        def hook(_m, _i, o):
            taps[key] = o.detach().reshape(-1, o.shape[-1]).float().clone()
        return hook

    for key, mod in modules.items():
        hooks.append(mod.register_forward_hook(grab(key)))
    try:
        with torch.no_grad():
            res = fn()
    finally:
        for h in hooks:
            h.remove()
    return res, taps
