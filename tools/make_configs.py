#!/usr/bin/env python3
"""Configs of the four released Gemma 4 models, in both forms a loader must accept.

data/configs/<name>.json      written by transformers 5.23.0 itself: Gemma4Config built from the
                              converter's variant table and saved with save_pretrained (the new
                              form: text_config.per_layer_config instead of global_head_dim /
                              num_global_key_value_heads).
data/configs/hub/<name>.json  the hub's legacy form (text_config carries global_head_dim and
                              num_global_key_value_heads), the form of the config.json files
                              published with the checkpoints (google/gemma-4-E2B, -E4B, -31B,
                              -26B-A4B on the Hugging Face Hub), built here from RELEASED below.

The converter (src/transformers/models/gemma4/convert_gemma4_weights.py) is not shipped in the
transformers wheel; _VARIANTS below is copied from it (huggingface/transformers, commit
ca5ff0b0d29a3b30277e4518644df411193f9490; the _VARIANTS table is identical at 0f3f0632).
No weights are created: the only model built is a text decoder on the "meta" device, to read
the tensor shapes transformers derives from each config.

Checks (the script fails if any does not hold):
  * both forms load with AutoConfig and resolve to the same per-layer layer_type, head_dim,
    num_key_value_heads and KV-sharing mode, and to the same text-decoder tensor shapes;
  * those shapes match the released checkpoints' (check_released below: q/k/v/o, MLP widths,
    experts, PLE, and the 31B text decoder's 30,697,345,340 parameters).

Usage (from the repository root, with the venv of docs/verification.md):
    venv/bin/python tools/make_configs.py [--out data/configs]
"""

import argparse
import copy
import json
import os
import tempfile

import torch
import transformers

assert torch.__version__.startswith("2.15"), torch.__version__
assert transformers.__version__ == "5.23.0", transformers.__version__
print(f"torch {torch.__version__}  transformers {transformers.__version__}")

from transformers import (  # noqa: E402
    AutoConfig,
    Gemma4AudioConfig,
    Gemma4Config,
    Gemma4TextConfig,
    Gemma4VisionConfig,
)
from transformers.models.gemma4.modeling_gemma4 import Gemma4TextModel  # noqa: E402

# ------------------------------------------------- converter _VARIANTS (copied) ---
_ON_DEVICE_VISION_CONFIG = dict(
    hidden_size=768, intermediate_size=3072, num_hidden_layers=16, num_attention_heads=12,
    num_key_value_heads=12, head_dim=64, global_head_dim=64, default_output_length=280,
    pooling_kernel_size=3, use_clipped_linears=True,
)
_LARGE_MODEL_VISION_CONFIG = dict(
    hidden_size=1152, intermediate_size=4304, num_hidden_layers=27, num_attention_heads=16,
    num_key_value_heads=16, head_dim=72, global_head_dim=72, default_output_length=280,
    pooling_kernel_size=3, use_clipped_linears=False, standardize=True,
)
_ROPE_PARAMS = {
    "full_attention": dict(rope_theta=1_000_000.0, rope_type="proportional", partial_rotary_factor=0.25),
    "sliding_attention": dict(rope_theta=10000.0, rope_type="default"),
}
_DEFAULT_LAYER_TYPES = ["sliding_attention"] * 5 + ["full_attention"]
_GEMMA_4_E2B_LAYER_TYPES = ["sliding_attention"] * 4 + ["full_attention"]


def _variants():
    return {
        "gemma-4-E2B": Gemma4Config(
            text_config=Gemma4TextConfig(
                hidden_size=1536, hidden_size_per_layer_input=256, intermediate_size=4 * 1536,
                num_hidden_layers=35, layer_types=_GEMMA_4_E2B_LAYER_TYPES * 7, num_attention_heads=8,
                num_key_value_heads=1, num_global_key_value_heads=None, attention_k_eq_v=False,
                use_bidirectional_attention=None, num_kv_shared_layers=20, use_double_wide_mlp=True,
                final_logit_softcapping=30.0, rope_parameters=copy.deepcopy(_ROPE_PARAMS),
            ),
            vision_config=Gemma4VisionConfig(**_ON_DEVICE_VISION_CONFIG),
            audio_config=Gemma4AudioConfig(),
            vision_soft_tokens_per_image=280,
        ),
        "gemma-4-E4B": Gemma4Config(
            text_config=Gemma4TextConfig(
                hidden_size=2560, hidden_size_per_layer_input=256, intermediate_size=4 * 2560,
                num_hidden_layers=42, layer_types=_DEFAULT_LAYER_TYPES * 7, num_attention_heads=8,
                num_key_value_heads=2, num_global_key_value_heads=None, global_head_dim=512,
                attention_k_eq_v=False, use_bidirectional_attention=None, num_kv_shared_layers=18,
                final_logit_softcapping=30.0, rope_parameters=copy.deepcopy(_ROPE_PARAMS),
            ),
            vision_config=Gemma4VisionConfig(**_ON_DEVICE_VISION_CONFIG),
            vision_soft_tokens_per_image=280,
            audio_config=Gemma4AudioConfig(),
        ),
        "gemma-4-31B": Gemma4Config(
            text_config=Gemma4TextConfig(
                hidden_size=5376, hidden_size_per_layer_input=0, intermediate_size=4 * 5376,
                num_hidden_layers=60, layer_types=_DEFAULT_LAYER_TYPES * 10, num_attention_heads=32,
                num_key_value_heads=16, num_global_key_value_heads=4, attention_k_eq_v=True,
                use_bidirectional_attention="vision", num_kv_shared_layers=0, sliding_window=1024,
                final_logit_softcapping=30.0, rope_parameters=copy.deepcopy(_ROPE_PARAMS),
                max_position_embeddings=262_144,
            ),
            vision_config=Gemma4VisionConfig(**_LARGE_MODEL_VISION_CONFIG),
            vision_soft_tokens_per_image=280,
        ),
        "gemma-4-26B-A4B": Gemma4Config(
            text_config=Gemma4TextConfig(
                hidden_size=2816, hidden_size_per_layer_input=0, intermediate_size=2112,
                num_hidden_layers=30, layer_types=_DEFAULT_LAYER_TYPES * 5, num_attention_heads=16,
                num_key_value_heads=8, num_global_key_value_heads=2, attention_k_eq_v=True,
                use_bidirectional_attention="vision", num_kv_shared_layers=0, enable_moe_block=True,
                num_experts=128, moe_intermediate_size=704, top_k_experts=8, sliding_window=1024,
                final_logit_softcapping=30.0, rope_parameters=copy.deepcopy(_ROPE_PARAMS),
                max_position_embeddings=262_144,
            ),
            vision_config=Gemma4VisionConfig(**_LARGE_MODEL_VISION_CONFIG),
            vision_soft_tokens_per_image=280,
        ),
    }


# ------------------------------------------- the released models, hub legacy form ---
RELEASED = {
    #                H     L   heads kv  gkv   k_eq_v  inter  shared double P    W     maxpos   pattern
    "gemma-4-E2B": (1536, 35, 8, 1, None, False, 6144, 20, True, 256, 512, 131072, 5),
    "gemma-4-E4B": (2560, 42, 8, 2, None, False, 10240, 18, False, 256, 512, 131072, 6),
    "gemma-4-31B": (5376, 60, 32, 16, 4, True, 21504, 0, False, 0, 1024, 262144, 6),
    "gemma-4-26B-A4B": (2816, 30, 16, 8, 2, True, 2112, 0, False, 0, 1024, 262144, 6),
}
SMALL_VISION_HUB = {
    "model_type": "gemma4_vision", "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 16,
    "num_attention_heads": 12, "num_key_value_heads": 12, "head_dim": 64, "global_head_dim": 64,
    "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-06, "max_position_embeddings": 131072,
    "attention_bias": False, "attention_dropout": 0.0, "rope_parameters": {"rope_type": "default", "rope_theta": 100.0},
    "pooling_kernel_size": 3, "patch_size": 16, "position_embedding_size": 10240, "default_output_length": 280,
    "use_clipped_linears": True, "standardize": False, "initializer_range": 0.02, "dtype": "bfloat16",
}
LARGE_VISION_HUB = dict(SMALL_VISION_HUB, hidden_size=1152, intermediate_size=4304, num_hidden_layers=27,
                        num_attention_heads=16, num_key_value_heads=16, head_dim=72, global_head_dim=72,
                        use_clipped_linears=False, standardize=True)
AUDIO_HUB = {
    "model_type": "gemma4_audio", "hidden_size": 1024, "num_hidden_layers": 12, "num_attention_heads": 8,
    "hidden_act": "silu", "subsampling_conv_channels": [128, 32], "conv_kernel_size": 5, "residual_weight": 0.5,
    "attention_chunk_size": 12, "attention_context_left": 13, "attention_context_right": 0,
    "attention_logit_cap": 50.0, "attention_invalid_logits_value": -1e9, "use_clipped_linears": True,
    "rms_norm_eps": 1e-06, "gradient_clipping": 1e10, "output_proj_dims": 1536, "initializer_range": 0.02,
    "dtype": "bfloat16",
}


def hub_config(name):
    H, L, NH, KV, GKV, KEQV, I, NSH, DBL, P, W, MAXPOS, PAT = RELEASED[name]
    if PAT == 5:
        layer_types = (["sliding_attention"] * 4 + ["full_attention"]) * (L // 5)
    else:
        layer_types = (["sliding_attention"] * 5 + ["full_attention"]) * (L // 6)
    moe = name == "gemma-4-26B-A4B"
    text = {
        "model_type": "gemma4_text",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attention_k_eq_v": KEQV,
        "bos_token_id": 2,
        "dtype": "bfloat16",
        "enable_moe_block": moe,
        "eos_token_id": 1,
        "final_logit_softcapping": 30.0,
        "global_head_dim": 512,
        "head_dim": 256,
        "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": H,
        "hidden_size_per_layer_input": P,
        "initializer_range": 0.02,
        "intermediate_size": I,
        "layer_types": layer_types,
        "max_position_embeddings": MAXPOS,
        "moe_intermediate_size": 704 if moe else None,
        "num_attention_heads": NH,
        "num_experts": 128 if moe else None,
        "num_global_key_value_heads": GKV,
        "num_hidden_layers": L,
        "num_key_value_heads": KV,
        "num_kv_shared_layers": NSH,
        "pad_token_id": 0,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {
            "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
        },
        "sliding_window": W,
        "tie_word_embeddings": True,
        "top_k_experts": 8 if moe else None,
        "use_bidirectional_attention": "vision" if name in ("gemma-4-31B", "gemma-4-26B-A4B") else None,
        "use_cache": True,
        "use_double_wide_mlp": DBL,
        "vocab_size": 262144,
        "vocab_size_per_layer_input": 262144,
    }
    small = name in ("gemma-4-E2B", "gemma-4-E4B")
    cfg = {
        "architectures": ["Gemma4ForConditionalGeneration"],
        "audio_config": dict(AUDIO_HUB) if small else None,
        "audio_token_id": 258881,
        "boa_token_id": 256000,
        "boi_token_id": 255999,
        "dtype": "bfloat16",
        "eoa_token_id": 258883,
        "eoa_token_index": 258883,
        "eoi_token_id": 258882,
        "eos_token_id": [1, 106],
        "image_token_id": 258880,
        "initializer_range": 0.02,
        "model_type": "gemma4",
        "text_config": text,
        "tie_word_embeddings": True,
        "video_token_id": 258884,
        "vision_config": dict(SMALL_VISION_HUB if small else LARGE_VISION_HUB),
        "vision_soft_tokens_per_image": 280,
    }
    return cfg


# ---------------------------------------------------------------- resolution ---
def resolved(path):
    """Per-layer view of the text config transformers builds from a config.json, plus the text
    decoder's tensor shapes (built on the meta device: no memory)."""
    d = tempfile.mkdtemp()
    with open(path) as f, open(os.path.join(d, "config.json"), "w") as g:
        g.write(f.read())
    cfg = AutoConfig.from_pretrained(d)
    assert isinstance(cfg, Gemma4Config), type(cfg)
    tc = cfg.get_text_config()
    per_layer = [
        (tc.layer_types[i], tc.per_layer_config[i].head_dim, tc.per_layer_config[i].num_key_value_heads,
         tc.kv_sharing_modes[i])
        for i in range(tc.num_hidden_layers)
    ]
    with torch.device("meta"):
        tm = Gemma4TextModel(tc)
    shapes = {k: tuple(v.shape) for k, v in tm.state_dict().items()}
    n_params = sum(v.numel() for v in tm.parameters()) + sum(
        b.numel() for n, b in tm.named_buffers() if n.endswith("layer_scalar"))
    return tc, per_layer, shapes, n_params


def check_released(name, tc, shapes, n_params):
    H, L, NH, KV, GKV, KEQV, I, NSH, DBL, P, W, MAXPOS, PAT = RELEASED[name]
    first_shared = L - NSH
    for i in range(L):
        full = tc.layer_types[i] == "full_attention"
        D = 512 if full else 256
        kvh = GKV if (full and KEQV and GKV is not None) else KV
        p = f"layers.{i}."
        assert shapes[p + "self_attn.q_proj.weight"] == (NH * D, H), (name, i)
        assert shapes[p + "self_attn.o_proj.weight"] == (H, NH * D), (name, i)
        assert shapes[p + "self_attn.q_norm.weight"] == (D,)
        if i < first_shared:
            assert shapes[p + "self_attn.k_proj.weight"] == (kvh * D, H), (name, i)
            assert shapes[p + "self_attn.k_norm.weight"] == (D,)
            assert (p + "self_attn.v_proj.weight" in shapes) == (not (KEQV and full)), (name, i)
            if p + "self_attn.v_proj.weight" in shapes:
                assert shapes[p + "self_attn.v_proj.weight"] == (kvh * D, H)
        else:
            assert p + "self_attn.k_proj.weight" not in shapes and p + "self_attn.k_norm.weight" not in shapes
        Ii = I * (2 if DBL and i >= first_shared else 1)
        assert shapes[p + "mlp.gate_proj.weight"] == (Ii, H), (name, i, shapes[p + "mlp.gate_proj.weight"])
        assert shapes[p + "mlp.down_proj.weight"] == (H, Ii)
        assert shapes[p + "layer_scalar"] == (1,)
        if P:
            assert shapes[p + "per_layer_input_gate.weight"] == (P, H)
            assert shapes[p + "per_layer_projection.weight"] == (H, P)
        if name == "gemma-4-26B-A4B":
            assert shapes[p + "experts.gate_up_proj"] == (128, 1408, 2816)
            assert shapes[p + "experts.down_proj"] == (128, 2816, 704)
            assert shapes[p + "router.proj.weight"] == (128, 2816)
            assert shapes[p + "router.scale"] == (2816,) and shapes[p + "router.per_expert_scale"] == (128,)
    if P:
        assert shapes["embed_tokens_per_layer.weight"] == (262144, L * P)
        assert shapes["per_layer_model_projection.weight"] == (L * P, H)
    if name == "gemma-4-31B":
        assert n_params == 30_697_345_340, n_params  # the 31B text decoder's parameters
    assert tc.sliding_window == W and tc.max_position_embeddings == MAXPOS


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="data/configs")
    args = ap.parse_args()
    os.makedirs(os.path.join(args.out, "hub"), exist_ok=True)

    for name, cfg in _variants().items():
        # As the converter: bf16 text/vision/audio, saved by save_pretrained of a
        # Gemma4ForConditionalGeneration (which records its class in `architectures`).
        cfg.text_config.dtype = torch.bfloat16
        cfg.vision_config.dtype = torch.bfloat16
        if cfg.audio_config is not None:
            cfg.audio_config.dtype = torch.bfloat16
        cfg.architectures = ["Gemma4ForConditionalGeneration"]
        d = tempfile.mkdtemp()
        cfg.save_pretrained(d)
        conv_path = os.path.join(args.out, f"{name}.json")
        with open(os.path.join(d, "config.json")) as f, open(conv_path, "w") as g:
            g.write(f.read())

        hub_path = os.path.join(args.out, "hub", f"{name}.json")
        with open(hub_path, "w") as g:
            json.dump(hub_config(name), g, indent=2, sort_keys=True)
            g.write("\n")

        tc_a, pl_a, sh_a, n_a = resolved(conv_path)
        tc_b, pl_b, sh_b, n_b = resolved(hub_path)
        assert pl_a == pl_b, f"{name}: per-layer resolution differs"
        assert sh_a == sh_b, f"{name}: text tensor shapes differ"
        assert n_a == n_b
        check_released(name, tc_a, sh_a, n_a)
        saved = json.load(open(conv_path))["text_config"]
        full = [i for i, t in enumerate(tc_a.layer_types) if t == "full_attention"]
        shared = [i for i, m in enumerate(tc_a.kv_sharing_modes) if m == "reuse"]
        store = [i for i, m in enumerate(tc_a.kv_sharing_modes) if m == "store"]
        print(f"{name:16s} OK  text params {n_a:,}  full layers {full}")
        print(f"{'':16s}     per_layer_config in {os.path.basename(conv_path)}: "
              f"{len(saved['per_layer_config'])} entries, e.g. {next(iter(saved['per_layer_config'].items()))}")
        print(f"{'':16s}     shared {shared[:1]}..{shared[-1:]} store {store}" if shared else
              f"{'':16s}     no KV sharing (kv_sharing_modes all None)")


if __name__ == "__main__":
    main()
