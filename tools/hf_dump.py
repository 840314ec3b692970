#!/usr/bin/env python3
"""Dump transformers' Gemma 4 activations under gemma4.h's tap names.

    venv/bin/python tools/hf_dump.py MODEL_DIR --ids 2,818,1010 --out DUMP.safetensors [--dtype float32|bfloat16]
                                     [--adapter PEFT_ADAPTER_DIR]

Runs the checkpoint in MODEL_DIR with transformers on the ids (one sequence,
one forward, no cache) and writes one safetensors file holding:

    input_ids                          I32 [S]
    <tap name>                         [S, cols] for every tap gemma4.h emits (see the
                                       g4_tap_fn comment in gemma4.h), e.g.
                                       layers.3.self_attn.q, layers.3.mlp, norm
    logits                             [S, V] after soft-capping

--dtype float32 (default) runs and stores float32. --dtype bfloat16 runs the
model in bfloat16, as transformers does for the released checkpoints, and
stores the bf16 tensors exactly. --dtype float64 runs in float64 and stores
the taps rounded to float32: a reference nearer the exact values than either
float32 order, to tell rounding from a bug (tools/check_real_shapes.sh). Attention and MoE experts use transformers'
"eager" implementations, whose rounding gemma4.h's bf16 mode reproduces.
--taps PATTERNS (comma-separated, fnmatch: "layers.*.experts,norm") keeps
only those taps (input_ids and logits always), for small committed dumps.

--adapter DIR loads a PEFT LoRA adapter onto the model as a user does,
peft.PeftModel.from_pretrained(model, DIR) (peft's default
autocast_adapter_dtype=True: the adapter runs in float32 even on a bf16 model;
peft casts x up to it and the sum back); compare it with
`build/gemma4 compare MODEL_DIR DUMP --adapter DIR`. --adapter-bf16 then casts
the adapter's weights to bfloat16 (as autocast_adapter_dtype=False leaves a bf16
adapter, or model.to(torch.bfloat16) does, which also casts transformers' float32
RoPE inv_freq buffers, so it is not used here): peft then runs lora_A, lora_B and
the scaling in bf16 (compare with --adapter-bf16 too). Not
with --grad.

The bits of a bf16 run depend on the kernels torch picks for this CPU: the
metadata records torch.backends.cpu.get_cpu_capability(). gemma4.h's bf16
mode reproduces the AVX2 kernels (8-lane sums); on an AVX-512 machine run
with ATEN_CPU_CAPABILITY=avx2 to get them.

--grad (float32, or float64 stored as float32) also runs model(input_ids, labels=labels).loss.backward()
(labels: --labels, default the ids; -100 ignored) and adds

    labels                             I32 [S]
    loss                               F32 [1]
    grad.<parameter>                   the gradient of every trained parameter, named as in
                                       the checkpoint (the tied lm_head under embed_tokens)
    grad.<tap name>                    dL/d(that tap's output) [S, cols], from tensor hooks,
                                       for the taps gemma4.h's backward reports (not
                                       self_attn.k/.v, whose tensors the reader layers share,
                                       nor logits)

Then `build/gemma4 compare MODEL_DIR DUMP.safetensors` runs gemma4.h on the same
ids and prints, tap by tap, where the two first disagree (with --grad dumps: the
loss, then the activation gradients and the parameter gradients in backward
order, each with its first divergence). Another runtime can
be compared the same way by writing its activations under these names.

Tested with torch 2.15.0 and transformers 5.23.0 (see data/tiny/VERSIONS.txt).
"""

import argparse
import fnmatch
import json

import torch
import transformers
from safetensors.torch import save_file
from transformers.models.gemma4 import modeling_gemma4 as mg
from transformers.models.gemma4_unified import modeling_gemma4_unified as mgu


def find_text_model(model):
    for m in model.modules():
        if isinstance(m, (mg.Gemma4TextModel, mgu.Gemma4UnifiedTextModel)):
            return m
    raise SystemExit("hf_dump: no Gemma4TextModel (or Gemma4UnifiedTextModel) inside this checkpoint's model")


def rows(t, S):
    """[1, S, ...] or [S, ...] -> [S, cols], detached copy."""
    t = t.detach()
    if t.dim() >= 2 and t.shape[0] == 1 and t.shape[1] == S:
        t = t[0]
    return t.reshape(S, -1).clone()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir")
    ap.add_argument("--ids", required=True, help="comma-separated token ids")
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtype", choices=["float32", "bfloat16", "float64"], default="float32")
    ap.add_argument("--taps", help="comma-separated fnmatch patterns of the taps to keep (default: all)")
    ap.add_argument("--grad", action="store_true", help="also the loss and the gradients (float32)")
    ap.add_argument("--labels", help="comma-separated labels for --grad (-100: ignored; default: the ids)")
    ap.add_argument("--adapter", help="a PEFT LoRA adapter directory, loaded with PeftModel.from_pretrained")
    ap.add_argument("--adapter-bf16", action="store_true",
                    help="then cast the adapter's weights to bfloat16: peft runs it in bf16")
    args = ap.parse_args()
    if args.grad and args.dtype == "bfloat16":
        raise SystemExit("hf_dump: --grad runs in float32 (or float64) only")
    if args.grad and args.adapter:
        raise SystemExit("hf_dump: --grad with --adapter is not supported (tools/make_lora_goldens.py has the adapter gradients)")

    ids = [int(x) for x in args.ids.split(",")]
    S = len(ids)
    dtype = getattr(torch, args.dtype)
    torch.set_num_threads(1)
    # ATen's own CPU kernels: on AVX-512 CPUs torch hands bf16 matmuls past 16^3
    # multiply-adds to oneDNN, whose summation order is its own (docs/bf16.md)
    torch.backends.mkldnn.enabled = False
    model = transformers.AutoModelForCausalLM.from_pretrained(
        args.model_dir, dtype=dtype, attn_implementation="eager", experts_implementation="eager")
    if args.adapter:
        import peft
        model = peft.PeftModel.from_pretrained(model, args.adapter)
        if args.adapter_bf16:  # the adapter's weights only: model.to() would also cast RoPE's float32 inv_freq
            with torch.no_grad():
                for n, p in model.named_parameters():
                    if "lora_" in n:
                        p.data = p.data.to(torch.bfloat16)
    model.eval()
    text = find_text_model(model)
    taps = {}
    grads = {}
    hooks = []

    def grad_hook(name, t):
        if args.grad and t.requires_grad:
            def keep(g):
                grads["grad." + name] = rows(g, S)
            t.register_hook(keep)

    def out_hook(name):
        def hook(_mod, _inp, out):
            t = out[0] if isinstance(out, tuple) else out
            taps[name] = rows(t, S)
            grad_hook(name, t)
        return hook

    def in_hook(name):
        def hook(_mod, inp):
            taps[name] = rows(inp[0], S)
            grad_hook(name, inp[0])
        return hook

    def add(module, name):
        if module is not None:
            hooks.append(module.register_forward_hook(out_hook(name)))

    add(text.embed_tokens, "embed_tokens")
    orig_project = getattr(text, "project_per_layer_inputs", None)  # Gemma4UnifiedTextModel has no PLE

    def project(*a, **k):
        out = orig_project(*a, **k)
        taps["per_layer_inputs"] = rows(out, S)
        grad_hook("per_layer_inputs", out)
        return out
    if orig_project is not None:
        text.project_per_layer_inputs = project

    for i, layer in enumerate(text.layers):
        p = f"layers.{i}."
        add(layer.input_layernorm, p + "input_layernorm")
        add(layer.self_attn, p + "self_attn")
        add(layer.post_attention_layernorm, p + "post_attention_layernorm")
        hooks.append(layer.pre_feedforward_layernorm.register_forward_pre_hook(in_hook(p + "pre_feedforward_layernorm:input")))
        add(layer.pre_feedforward_layernorm, p + "pre_feedforward_layernorm")
        add(layer.mlp, p + "mlp")
        for n in ("post_feedforward_layernorm_1", "pre_feedforward_layernorm_2", "experts",
                  "post_feedforward_layernorm_2", "per_layer_input_gate", "per_layer_projection",
                  "post_per_layer_input_norm"):
            add(getattr(layer, n, None), p + n)
        add(layer.post_feedforward_layernorm, p + "post_feedforward_layernorm")
        add(layer, f"layers.{i}")
    add(text.norm, "norm")

    # q after q_norm + RoPE, K and V as attended: the arguments of the attention function.
    mod = mgu if isinstance(text, mgu.Gemma4UnifiedTextModel) else mg
    orig_eager = mod.eager_attention_forward

    def eager(module, query, key, value, *a, **k):
        p = f"layers.{module.layer_idx}.self_attn."
        for name, t in (("q", query), ("k", key), ("v", value)):  # [1, heads, S, D] -> [S, heads*D]
            taps[p + name] = t.detach()[0].transpose(0, 1).reshape(S, -1).clone()
        if args.grad and query.requires_grad:
            def keep(g, name=p + "q"):
                grads["grad." + name] = g.detach()[0].transpose(0, 1).reshape(S, -1).clone()
            query.register_hook(keep)
        return orig_eager(module, query, key, value, *a, **k)
    mod.eager_attention_forward = eager

    extra = {}
    if args.grad:
        labels = [int(x) for x in args.labels.split(",")] if args.labels else list(ids)
        if len(labels) != S:
            raise SystemExit(f"hf_dump: {len(labels)} labels for {S} ids")
        out = model(input_ids=torch.tensor([ids]), labels=torch.tensor([labels]), use_cache=False)
        out.loss.backward()
        extra["labels"] = torch.tensor(labels, dtype=torch.int32)
        extra["loss"] = out.loss.detach().reshape(1).float()
        prefix = "model.language_model." if text is not getattr(model, "model", None) else "model."
        for n, p in text.named_parameters():
            if p.grad is not None:
                extra["grad." + prefix + n] = p.grad.detach().float().contiguous()
        extra.update({k: v.float().contiguous() for k, v in grads.items()})
    else:
        with torch.no_grad():
            out = model(input_ids=torch.tensor([ids]), use_cache=False)
    mod.eager_attention_forward = orig_eager
    for h in hooks:
        h.remove()

    taps["logits"] = rows(out.logits, S)
    if args.taps:
        pats = args.taps.split(",")
        taps = {k: v for k, v in taps.items() if k == "logits" or any(fnmatch.fnmatchcase(k, p) for p in pats)}
    tensors = {"input_ids": torch.tensor(ids, dtype=torch.int32)}
    store = torch.float32 if dtype == torch.float64 else dtype  # a float64 run is stored rounded to float32
    tensors.update({k: v.to(store).contiguous() for k, v in taps.items()})
    tensors.update(extra)
    meta = {"format": "gemma4.h taps 1", "dtype": args.dtype, "transformers": transformers.__version__,
            "torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "threads": str(torch.get_num_threads()), "order": json.dumps(list(taps))}
    if args.adapter:
        import peft
        meta.update({"peft": peft.__version__, "adapter": args.adapter, "adapter_dtype": "bfloat16" if args.adapter_bf16 else "float32"})
    save_file(tensors, args.out, metadata=meta)
    print(f"hf_dump: {len(taps)} taps, {S} tokens, {args.dtype}"
          + (f", loss {float(extra['loss']):.7f}, {len(extra) - 2} gradients" if args.grad else "") + f" -> {args.out}")


if __name__ == "__main__":
    main()
