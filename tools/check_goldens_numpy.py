#!/usr/bin/env python3
"""Independent NumPy re-implementation of the Gemma 4 text decoder, checked against the
goldens. It was written from a prose description of the architecture (the math docs/ and README.md
and gemma4.h's comments describe), not from transformers' code, and it imports neither
transformers nor torch: a second oracle whose mistakes would not be transformers' own.

It reads only config.json + the safetensors files of each data/tiny/<model>/ directory,
the way a C loader would:
  * text config at the top level (Gemma4ForCausalLM, prefix "model.") or under
    "text_config" (Gemma4ForConditionalGeneration, prefix "model.language_model.");
  * per-layer head_dim / KV heads from "per_layer_config" (new form) or from
    "global_head_dim" (default 512) / "num_global_key_value_heads" (legacy form);
  * layer_types default pattern when absent, last layer forced to full attention;
  * single-file or sharded (model.safetensors.index.json) weights; unknown tensors
    (vision/audio towers, stale k/v of KV-shared layers) are ignored.

All math in float32.  Usage (from the repository root, with the venv of docs/verification.md):
    venv/bin/python tools/check_goldens_numpy.py [data/tiny]
"""

import json
import os
import sys

import numpy as np
from safetensors.numpy import load_file as np_load_file

F32 = np.float32


def load_weights(d):
    idx = os.path.join(d, "model.safetensors.index.json")
    files = sorted(set(json.load(open(idx))["weight_map"].values())) if os.path.exists(idx) else ["model.safetensors"]
    w = {}
    for f in files:
        # safetensors.numpy cannot represent bf16; go through torch only for the dtype conversion.
        import torch
        from safetensors.torch import load_file
        for k, v in load_file(os.path.join(d, f)).items():
            w[k] = v.to(torch.float32).numpy()
    return w


class Cfg:
    def __init__(self, d):
        raw = json.load(open(d if d.endswith(".json") else os.path.join(d, "config.json")))
        if "text_config" in raw:
            t, self.prefix = raw["text_config"], "model.language_model."
        else:
            t, self.prefix = raw, "model."
        self.t = t
        g = t.get
        self.V, self.H, self.L = g("vocab_size", 262144), g("hidden_size", 2304), g("num_hidden_layers", 30)
        self.NH, self.hd, self.kvh = g("num_attention_heads", 8), g("head_dim", 256), g("num_key_value_heads", 4)
        self.I = g("intermediate_size", 9216)
        self.eps = g("rms_norm_eps", 1e-6)
        self.W = g("sliding_window", 512)
        self.cap = g("final_logit_softcapping")
        self.P = g("hidden_size_per_layer_input", 256)
        self.k_eq_v = g("attention_k_eq_v", False)
        self.n_shared = g("num_kv_shared_layers", 0)
        self.double = g("use_double_wide_mlp", False)
        self.moe = g("enable_moe_block", False)
        self.E, self.K, self.Ie = g("num_experts"), g("top_k_experts"), g("moe_intermediate_size")
        lt = g("layer_types")
        if lt is None:
            lt = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(self.L)]
        lt = list(lt)
        lt[-1] = "full_attention"
        self.types = lt
        self.rope = g("rope_parameters") or {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6},
        }
        self.D = [self.hd] * self.L
        self.KVH = [self.kvh] * self.L
        if "per_layer_config" in t:
            for k, ov in t["per_layer_config"].items():
                i = int(k)
                self.D[i] = ov.get("head_dim", self.D[i])
                self.KVH[i] = ov.get("num_key_value_heads", self.KVH[i])
        else:
            ghd = g("global_head_dim", 512)
            ngkv = g("num_global_key_value_heads")
            for i in range(self.L):
                if lt[i] == "full_attention":
                    self.D[i] = ghd
                    if self.k_eq_v and ngkv is not None:
                        self.KVH[i] = ngkv
        self.first_shared = self.L - self.n_shared
        self.src = {}
        if self.n_shared:
            for t_ in set(lt):
                cands = [j for j in range(self.first_shared) if lt[j] == t_]
                assert cands, f"no source layer for type {t_}"
                self.src[t_] = max(cands)


def rms(x, w=None, eps=1e-6):
    x = x.astype(F32)
    ms = np.mean(x * x, axis=-1, keepdims=True, dtype=F32) + F32(eps)
    y = x * np.power(ms, F32(-0.5))
    return y * w.astype(F32) if w is not None else y


def gelu(x):
    c = F32(np.sqrt(2.0 / np.pi))
    return F32(0.5) * x * (F32(1.0) + np.tanh(c * (x + F32(0.044715) * x * x * x)))


def inv_freq(cfg, typ, D):
    rp = cfg.rope[typ]
    theta = rp["rope_theta"]
    if rp.get("rope_type", "default") == "default":
        return (1.0 / (theta ** (np.arange(0, D, 2, dtype=F32) / F32(D)))).astype(F32)
    p = rp.get("partial_rotary_factor", 1.0)
    n_rot = int(p * D // 2)
    inv = np.zeros(D // 2, F32)
    inv[:n_rot] = 1.0 / (theta ** (np.arange(0, 2 * n_rot, 2, dtype=F32) / F32(D)))
    return (inv / F32(rp.get("factor", 1.0))).astype(F32)


def rope(x, pos, inv):  # x [S, heads, D]
    ang = pos[:, None].astype(F32) * inv[None, :]
    emb = np.concatenate([ang, ang], -1)
    cos, sin = np.cos(emb)[:, None, :], np.sin(emb)[:, None, :]
    h = x.shape[-1] // 2
    rot = np.concatenate([-x[..., h:], x[..., :h]], -1)
    return x * cos + rot * sin


def forward(cfg, w, ids, record=None):
    p = cfg.prefix
    S = len(ids)
    pos = np.arange(S)
    E = w[p + "embed_tokens.weight"]
    x = E[ids] * F32(np.sqrt(cfg.H))  # f32 model: the scale is fp32 sqrt(H) (bf16-rounded only for bf16 runs)
    if record is not None:
        record["embed"] = x
    pli = None
    if cfg.P:
        T = w[p + "embed_tokens_per_layer.weight"][ids] * F32(np.sqrt(cfg.P))
        C = (x @ w[p + "per_layer_model_projection.weight"].T) * F32(cfg.H ** -0.5)
        C = rms(C.reshape(S, cfg.L, cfg.P), w[p + "per_layer_projection_norm.weight"], cfg.eps)
        pli = (C + T.reshape(S, cfg.L, cfg.P)) * F32(2.0 ** -0.5)
        if record is not None:
            record["per_layer_inputs"] = pli
    q_i = np.arange(S)[:, None]
    k_i = np.arange(S)[None, :]
    masks = {"full_attention": k_i <= q_i, "sliding_attention": (k_i <= q_i) & (k_i > q_i - cfg.W)}
    shared = {}
    for i in range(cfg.L):
        lp = f"{p}layers.{i}."
        typ, D, KVH = cfg.types[i], cfg.D[i], cfg.KVH[i]
        inv = inv_freq(cfg, typ, D)
        # attention
        a_in = rms(x, w[lp + "input_layernorm.weight"], cfg.eps)
        q = (a_in @ w[lp + "self_attn.q_proj.weight"].T).reshape(S, cfg.NH, D)
        q = rope(rms(q, w[lp + "self_attn.q_norm.weight"], cfg.eps), pos, inv)
        if i >= cfg.first_shared and cfg.n_shared:
            k, v = shared[typ]
        else:
            kr = (a_in @ w[lp + "self_attn.k_proj.weight"].T).reshape(S, KVH, D)
            has_v = not (cfg.k_eq_v and typ == "full_attention")
            vr = (a_in @ w[lp + "self_attn.v_proj.weight"].T).reshape(S, KVH, D) if has_v else kr
            k = rope(rms(kr, w[lp + "self_attn.k_norm.weight"], cfg.eps), pos, inv)
            v = rms(vr, None, cfg.eps)
            if cfg.n_shared and cfg.src.get(typ) == i:
                shared[typ] = (k, v)
        rep = cfg.NH // k.shape[1]
        kk, vv = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)  # head h uses kv head h // rep
        sc = np.einsum("qhd,khd->hqk", q, kk)  # score scale 1.0
        sc = np.where(masks[typ][None], sc, -np.inf)
        sc = sc - sc.max(-1, keepdims=True)
        pr = np.exp(sc)
        pr = pr / pr.sum(-1, keepdims=True)
        o = np.einsum("hqk,khd->qhd", pr, vv).reshape(S, cfg.NH * D)
        a = o @ w[lp + "self_attn.o_proj.weight"].T
        x = x + rms(a, w[lp + "post_attention_layernorm.weight"], cfg.eps)
        # MLP (+ MoE)
        r = x
        h = rms(r, w[lp + "pre_feedforward_layernorm.weight"], cfg.eps)
        m = (gelu(h @ w[lp + "mlp.gate_proj.weight"].T) * (h @ w[lp + "mlp.up_proj.weight"].T)) @ w[lp + "mlp.down_proj.weight"].T
        if cfg.moe:
            m1 = rms(m, w[lp + "post_feedforward_layernorm_1.weight"], cfg.eps)
            u = rms(r, None, cfg.eps) * w[lp + "router.scale"] * F32(cfg.H ** -0.5)
            lg = u @ w[lp + "router.proj.weight"].T
            lg = lg - lg.max(-1, keepdims=True)
            pe = np.exp(lg)
            pe = pe / pe.sum(-1, keepdims=True)
            top = np.argsort(-pe, axis=-1, kind="stable")[:, : cfg.K]
            tw = np.take_along_axis(pe, top, -1)
            tw = tw / tw.sum(-1, keepdims=True) * w[lp + "router.per_expert_scale"][top]
            xn = rms(r, w[lp + "pre_feedforward_layernorm_2.weight"], cfg.eps)
            GU, DN = w[lp + "experts.gate_up_proj"], w[lp + "experts.down_proj"]
            e_out = np.zeros_like(r)
            for s in range(S):
                for j in range(cfg.K):
                    e = top[s, j]
                    gu = GU[e] @ xn[s]
                    y = DN[e] @ (gelu(gu[: cfg.Ie]) * gu[cfg.Ie:])
                    e_out[s] += tw[s, j] * y
            m2 = rms(e_out, w[lp + "post_feedforward_layernorm_2.weight"], cfg.eps)
            m = m1 + m2
        x = r + rms(m, w[lp + "post_feedforward_layernorm.weight"], cfg.eps)
        # PLE
        if cfg.P:
            g_ = gelu(x @ w[lp + "per_layer_input_gate.weight"].T) * pli[:, i, :]
            x = x + rms(g_ @ w[lp + "per_layer_projection.weight"].T, w[lp + "post_per_layer_input_norm.weight"], cfg.eps)
        x = x * w[lp + "layer_scalar"]
        if record is not None:
            record[f"layer.{i}"] = x
    x = rms(x, w[p + "norm.weight"], cfg.eps)
    if record is not None:
        record["final_norm"] = x
    logits = x @ E.T
    if cfg.cap:
        logits = F32(cfg.cap) * np.tanh(logits / F32(cfg.cap))
    return logits


def check(d):
    import torch
    from safetensors.torch import load_file
    cfg = Cfg(d)
    w = load_weights(d)
    gold = {k: v.numpy() for k, v in load_file(os.path.join(d, "golden.safetensors")).items()}
    ids = gold["input_ids"].astype(np.int64)
    rec = {}
    logits = forward(cfg, w, ids, rec)
    rec["logits"] = logits
    worst = 0.0
    lines = []
    for k in sorted(rec, key=lambda s: (s.split(".")[0], int(s.split(".")[1]) if "." in s else 0)):
        g = gold[k]
        scale = max(1.0, float(np.abs(g).max()))
        err = float(np.abs(rec[k] - g).max()) / scale
        worst = max(worst, err)
        lines.append(f"{k}:{err:.1e}")
    # greedy, cache-free
    seq = list(gold["greedy_ids"][:6])
    n_new = len(gold["greedy_ids"]) - 6
    step_err = 0.0
    for s in range(n_new):
        lg = forward(cfg, w, np.array(seq))[-1]
        step_err = max(step_err, float(np.abs(lg - gold["greedy_logits"][s]).max()) / max(1.0, float(np.abs(lg).max())))
        seq.append(int(lg.argmax()))
    ok_greedy = seq == list(gold["greedy_ids"])
    print(f"{os.path.basename(d):12s} D={cfg.D} KVH={cfg.KVH} src={cfg.src}")
    print(f"             max rel err {worst:.2e}; greedy ids {'MATCH' if ok_greedy else 'MISMATCH'}; "
          f"greedy_logits rel err {step_err:.2e}")
    print("             " + " ".join(lines))
    return worst < 1e-4 and ok_greedy and step_err < 1e-4


def check_configs(root):
    """The released configs: new form (data/configs) and hub legacy form (data/configs/hub) must
    resolve to the same per-layer geometry with this loader logic too."""
    ok = True
    for f in sorted(os.listdir(root)):
        if not f.endswith(".json"):
            continue
        a, b = Cfg(os.path.join(root, f)), Cfg(os.path.join(root, "hub", f))
        same = (a.types, a.D, a.KVH, a.src, a.first_shared) == (b.types, b.D, b.KVH, b.src, b.first_shared)
        ok &= same
        print(f"config {f:22s} new form == hub form: {same}; full layers "
              f"{[i for i, t in enumerate(a.types) if t == 'full_attention']} D_full={max(a.D)} "
              f"KVH full/sliding={a.KVH[a.types.index('full_attention')]}/{a.KVH[0]} kv sources={a.src}")
    return ok


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "data/tiny"
    ok = True
    cfg_root = os.path.join(os.path.dirname(os.path.abspath(root)), "configs")
    if os.path.isdir(cfg_root):
        ok &= check_configs(cfg_root)
    for name in sorted(os.listdir(root)):
        d = os.path.join(root, name)
        if not os.path.isdir(d):
            continue
        cfg = json.load(open(os.path.join(d, "config.json")))
        if cfg.get("model_type") == "gemma4_assistant":  # a drafter reads its target's K/V: not this decoder
            print(f"{name}: skipped (a drafter, gemma4_assistant; tests/test_drafter.c checks it against transformers)")
            continue
        ok &= check(d)
    print("ALL OK" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
