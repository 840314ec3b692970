#!/usr/bin/env python3
"""Disk and memory of the four released Gemma 4 checkpoints, computed from their configs
(data/configs/hub/<name>.json, the hub's form): the README's table under "Running a real checkpoint".

Builds transformers' Gemma4ForConditionalGeneration from each config on the "meta" device (no
weights) and counts parameters:
  all            every tensor of the published checkpoint (text decoder, vision tower, audio
                 tower, their embedders) x 2 bytes: the files are bf16. Google's files also keep
                 k_proj/v_proj/k_norm for the KV-reader layers, which transformers' model lacks:
                 counted separately ("stale").
  text           the text decoder, what gemma4.h binds (the towers are mapped but never read).
  per token      what one decode step reads: every text weight once (the tied embedding as the
                 lm_head), one row of the per-layer embedding table, and top_k / num_experts of
                 the MoE experts. gemma4 bench reports the same count ("GB of weights per token").
GB here are 1e9 bytes. Usage (from the repository root, with the venv of docs/verification.md):
    venv/bin/python tools/checkpoint_sizes.py
"""
import torch
import transformers
from transformers import AutoConfig, Gemma4ForConditionalGeneration

print(f"torch {torch.__version__}  transformers {transformers.__version__}")
for name in ["gemma-4-E2B", "gemma-4-E4B", "gemma-4-31B", "gemma-4-26B-A4B"]:
    cfg = AutoConfig.from_pretrained(f"data/configs/hub/{name}.json")
    tc = cfg.text_config
    with torch.device("meta"):
        model = Gemma4ForConditionalGeneration(cfg)
    everything = sum(p.numel() for p in model.parameters())
    text = per_token = 0
    for n, p in model.model.language_model.named_parameters():
        text += p.numel()
        if n.startswith("embed_tokens_per_layer."):
            per_token += p.shape[1]
        elif ".experts." in n:
            per_token += p.numel() * tc.top_k_experts / tc.num_experts
        else:
            per_token += p.numel()
    # the readers' stale K/V weights in Google's files: k_proj, v_proj [kv_heads * D, H], k_norm [D]
    stale = 0
    first_shared = tc.num_hidden_layers - (tc.num_kv_shared_layers or 0)
    for i in range(first_shared, tc.num_hidden_layers):
        d, kvh = tc.per_layer_config[i].head_dim, tc.per_layer_config[i].num_key_value_heads
        stale += 2 * kvh * d * tc.hidden_size + d
    print(f"{name:16s} all {everything / 1e9:6.3f} B params = {2 * everything / 1e9:6.2f} GB"
          f" (+ stale reader K/V {2 * stale / 1e9:.2f} GB); text decoder {text / 1e9:6.3f} B = {2 * text / 1e9:6.2f} GB;"
          f" read per decoded token {2 * per_token / 1e9:6.3f} GB")
