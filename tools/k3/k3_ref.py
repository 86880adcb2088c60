#!/usr/bin/python3
"""An independent float64 numpy reference of the Kimi K3 forward pass, written from the spec.

Follows `kimi_k3_model.md` §3 line by line: AttnRes control flow (§3.1/§3.2), Kimi Delta
Attention (§3.3), gated NoPE MLA (§3.4), the dense SiTU MLP (§3.5), LatentMoE on MXFP4 experts
(§3.6, §4.1), the output head (§3.7). Everything is computed in float64 from the stored values
(BF16, F16 and F32 convert exactly; MXFP4 is decoded exactly). A full-precision snapshot (spec
§9.8: F32 where §2.3 says BF16, routed experts as plain F32 `w{1,2,3}.weight`) is read too. It reads the Hugging Face snapshot
with its own minimal safetensors reader and checks every tensor's name, dtype and shape against
the table of spec §2.3 before using it. It shares no code with the C++ engine.

Vendor choices where the spec records a DISAGREEMENT (§3.9): `A_log` is per head (entries
0…H−1 of the stored vector, the rest must be 0); the MLA latent norms use epsilon 1e-6 unless
`--mla-eps` says otherwise; router ties go to the lowest expert index.

Usage (see FIXTURE.md):
  k3_ref.py run --model DIR (--ids 1,2,3 | --x0 FILE.f32 --rows T) [--layers N]
                [--out-logits FILE] [--out-trace FILE] [--out-sublayers FILE]
                [--mla-eps 1e-6] [--greedy N]
  k3_ref.py layer --model DIR --layer I --kind KIND --in FILE [--rows T] [--out FILE]
                  [--prenorm] [--mla-eps E] [--expert E]
  k3_ref.py check --model DIR      (reads and validates every text tensor)

Importable: rms_norm, situ, l2n, attnres_mix, kda_layer, mla_layer, mla_layer_absorbed,
dense_mlp, latent_moe, route, mxfp4_dequant, Snapshot, Config, Model.
"""

import argparse
import json
import math
import os
import struct
import sys

import numpy as np


class RefError(Exception):
    """A bad snapshot, config or request; the message names the file, tensor or key."""


# ---------------------------------------------------------------------------------------------
# Primitives (spec §3.0)


def sigmoid(x):
    """Logistic sigmoid, accurate in float64 for either sign (no overflow, no cancellation)."""
    e = np.exp(-np.abs(x))
    return np.where(np.asarray(x) >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def silu(x):
    return x * sigmoid(x)


def rms_norm(x, w, eps):
    """x / sqrt(mean(x^2) + eps) * w over the last axis."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def l2n(x, eps=1e-6):
    """x / sqrt(sum(x^2) + eps) over the last axis (epsilon inside the root, on the sum)."""
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)


def situ(g, u, beta1=4.0, beta2=25.0):
    """SiTU(g, u) = b1 tanh(g/b1) sigmoid(g) * b2 tanh(u/b2)."""
    return beta1 * np.tanh(g / beta1) * sigmoid(g) * (beta2 * np.tanh(u / beta2))


def glu(x, w_gate, w_up, w_down, beta1, beta2):
    """Dn . SiTU(G x, U x) for rows of x."""
    return situ(x @ w_gate.T, x @ w_up.T, beta1, beta2) @ w_down.T


# ---------------------------------------------------------------------------------------------
# MXFP4 (spec §4.1)

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                 -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def mxfp4_dequant(packed, scale):
    """packed u8 [O, I/2] (low nibble = even column), scale u8 E8M0 [O, I/32] -> f64 [O, I].
    Exact: W[o,i] = E2M1[code] * 2^(s-127); s = 255 is NaN (OCP)."""
    packed = np.asarray(packed, dtype=np.uint8)
    scale = np.asarray(scale, dtype=np.uint8)
    rows, half = packed.shape
    cols = 2 * half
    if scale.shape != (rows, cols // 32) or cols % 32:
        raise RefError(f"mxfp4: packed {packed.shape} and scale {scale.shape} do not match")
    codes = np.empty((rows, cols), dtype=np.uint8)
    codes[:, 0::2] = packed & 0x0F
    codes[:, 1::2] = packed >> 4
    factor = np.ldexp(1.0, scale.astype(np.int64) - 127)
    factor[scale == 255] = np.nan
    return E2M1[codes] * np.repeat(factor, 32, axis=1)


# ---------------------------------------------------------------------------------------------
# Load-time quantization of the dense matrices (spec §4.2, §4.3), emulated exactly: the
# quantizer runs in float32 as the engine's does; the reference then uses the dequantized
# values (q * s) in float64, which equals the engine's s * sum(q * x) up to summation order.


def quant_int8_rows(w):
    """int8 per row: s_r = max|W_r|/127 (floor 1e-20), q = clamp(rint(W * (1/s_r)), -127, 127),
    all in float32, half to even. Returns (q int8 [O, I], s float32 [O])."""
    w32 = np.asarray(w, dtype=np.float32)
    s = np.maximum(np.max(np.abs(w32), axis=1) / np.float32(127), np.float32(1e-20))
    inv = np.float32(1) / s
    q = np.clip(np.rint(w32 * inv[:, None]), -127, 127)
    return q.astype(np.int8), s


def quant_int4_g64(w):
    """int4 per 64-column group: s = max|W_g|/7 (floor 1e-20), q = clamp(rint(W * (1/s)), -8, 7).
    Returns (q int8 in [-8, 7] [O, I], s float32 [O, I/64])."""
    w32 = np.asarray(w, dtype=np.float32)
    rows, cols = w32.shape
    if cols % 64:
        raise RefError(f"int4-g64 needs a multiple of 64 columns, got {cols}")
    g = w32.reshape(rows, cols // 64, 64)
    s = np.maximum(np.max(np.abs(g), axis=2) / np.float32(7), np.float32(1e-20))
    inv = np.float32(1) / s
    q = np.clip(np.rint(g * inv[:, :, None]), -8, 7)
    return q.reshape(rows, cols).astype(np.int8), s


def quantize_dequant(w, bits):
    """The values a matrix has after the engine's load-time quantization with `bits` (32 = none;
    4 falls back to int8 when the width is not a multiple of 64, as spec §4.3 says)."""
    if bits == 32:
        return w
    if bits == 4 and w.shape[1] % 64 == 0:
        q, s = quant_int4_g64(w)
        return (q.reshape(w.shape[0], -1, 64).astype(np.float64) *
                s[:, :, None].astype(np.float64)).reshape(w.shape)
    if bits in (4, 8):
        q, s = quant_int8_rows(w)
        return q.astype(np.float64) * s[:, None].astype(np.float64)
    raise RefError(f"unsupported bits {bits} (4, 8 or 32)")


# Which matrices each switch quantizes (K3_BITS, K3_MLA_BITS; K3_HEAD_BITS is the lm_head).
# Everything else (router, f_a/f_b, b_proj, norms, conv, biases, embedding) stays exact.
BITS_KEYS = {"kda": ("q", "k", "v", "g", "o"), "dense": ("gate", "up", "down"),
             "moe": ("down_lat", "up_lat", "sh_gate", "sh_up", "sh_down")}
MLA_BITS_KEYS = ("q_a", "q_b", "kv_a", "kv_b", "g", "o")


# ---------------------------------------------------------------------------------------------
# Safetensors reading


_DTYPES = {"BF16": (2, np.uint16), "F16": (2, np.float16), "F32": (4, np.float32),
           "F64": (8, np.float64), "U8": (1, np.uint8), "I8": (1, np.int8),
           "I16": (2, np.int16), "I32": (4, np.int32), "I64": (8, np.int64),
           "BOOL": (1, np.bool_), "F8_E4M3": (1, np.uint8), "F8_E5M2": (1, np.uint8)}


class ShardFile:
    """One .safetensors file: header parsed and validated on open, data read through a memmap."""

    def __init__(self, path):
        self.path = path
        try:
            size = os.path.getsize(path)
            with open(path, "rb") as f:
                raw = f.read(8)
                if len(raw) < 8:
                    raise RefError(f"{path}: truncated (no header length)")
                (n,) = struct.unpack("<Q", raw)
                if n > size - 8 or n > 100 * 2**20:
                    raise RefError(f"{path}: header length {n} exceeds the file ({size} bytes)")
                header = json.loads(f.read(n).decode("utf-8"))
        except OSError as e:
            raise RefError(f"{path}: {e}") from e
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise RefError(f"{path}: header is not valid JSON ({e})") from e
        self.data_start = 8 + n
        self.size = size
        self.tensors = {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            try:
                dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
            except (KeyError, TypeError, ValueError) as e:
                raise RefError(f"{path}: tensor '{name}': malformed header entry") from e
            if dtype not in _DTYPES:
                raise RefError(f"{path}: tensor '{name}': unknown dtype {dtype}")
            nbytes = _DTYPES[dtype][0] * int(np.prod(shape, dtype=np.int64))
            if end - begin != nbytes or begin < 0:
                raise RefError(f"{path}: tensor '{name}': data_offsets [{begin}, {end}] do not "
                               f"hold {dtype} {shape}")
            if self.data_start + end > size:
                raise RefError(f"{path}: tensor '{name}': data ends at "
                               f"{self.data_start + end}, file has {size} bytes (truncated?)")
            self.tensors[name] = (dtype, list(shape), self.data_start + begin, nbytes)
        self._map = None

    def raw(self, name):
        """The tensor's bytes as a numpy array of its dtype and shape (a memmap view)."""
        dtype, shape, offset, nbytes = self.tensors[name]
        if self._map is None:
            self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        return self._map[offset:offset + nbytes].view(_DTYPES[dtype][1]).reshape(shape)


class Snapshot:
    """A folder with model.safetensors.index.json (or a single model.safetensors), or one
    .safetensors file. Shards are opened on first use; vision shards are never opened."""

    def __init__(self, path):
        self.dir = path if os.path.isdir(path) else os.path.dirname(path)
        self._shards = {}
        index = os.path.join(path, "model.safetensors.index.json")
        if os.path.isdir(path) and os.path.exists(index):
            try:
                with open(index) as f:
                    self.weight_map = dict(json.load(f)["weight_map"])
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise RefError(f"{index}: not a valid index ({e})") from e
        else:
            single = os.path.join(path, "model.safetensors") if os.path.isdir(path) else path
            if not os.path.exists(single):
                raise RefError(f"{path}: no model.safetensors.index.json or model.safetensors")
            name = os.path.basename(single)
            self.weight_map = {t: name for t in self._shard(name).tensors}
        probe = "model.layers.0.input_layernorm.weight"
        if "language_model." + probe in self.weight_map:
            self.prefix = "language_model."
        elif probe in self.weight_map:
            self.prefix = ""
        else:
            raise RefError(f"{path}: neither 'language_model.{probe}' nor '{probe}' is present")

    def _shard(self, fname):
        if fname not in self._shards:
            self._shards[fname] = ShardFile(os.path.join(self.dir, fname))
        return self._shards[fname]

    def has(self, name):
        return self.prefix + name in self.weight_map

    def info(self, name):
        """(dtype, shape, absolute offset, nbytes, shard file name) of a text tensor."""
        full = self.prefix + name
        if full not in self.weight_map:
            raise RefError(f"tensor '{full}': missing from the index")
        fname = self.weight_map[full]
        shard = self._shard(fname)
        if full not in shard.tensors:
            raise RefError(f"tensor '{full}': the index names {fname}, which does not hold it")
        return shard.tensors[full] + (fname,)

    def raw(self, name, dtype, shape):
        """The tensor's stored values, after checking dtype and shape. Where spec §2.3 says BF16,
        F32 and F16 are accepted too (a full-precision save_pretrained snapshot, spec §9.8);
        the stored dtype is then the array's dtype (see stored_dtype)."""
        full = self.prefix + name
        got_dtype, got_shape = self.info(name)[:2]
        ok = got_dtype in _BF16_SLOT if dtype == "BF16" else got_dtype == dtype
        if not ok or list(got_shape) != list(shape):
            want = "BF16 (or F32/F16)" if dtype == "BF16" else dtype
            raise RefError(f"tensor '{full}': expected {want} {list(shape)}, "
                           f"got {got_dtype} {got_shape}")
        return self._shard(self.weight_map[full]).raw(full)

    def stored_dtype(self, name):
        return self.info(name)[0]

    def f64(self, name, dtype, shape):
        return to_f64(self.raw(name, dtype, shape), self.stored_dtype(name))


# Dtypes accepted where the spec's table says BF16 (each converts exactly to float64).
_BF16_SLOT = ("BF16", "F32", "F16")


def to_f64(a, dtype):
    """Stored values of `dtype` (BF16 as uint16 bits) as float64, exactly."""
    if dtype == "BF16":
        return (np.asarray(a).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return np.asarray(a, dtype=np.float64)


# ---------------------------------------------------------------------------------------------
# Config (spec §1)


class Config:
    """The text model's hyper-parameters, read from `text_config` when present (spec §1.1)."""

    def __init__(self, path):
        try:
            with open(path) as f:
                root = json.load(f)
        except (OSError, ValueError) as e:
            raise RefError(f"{path}: {e}") from e
        t = root.get("text_config")
        base = "text_config." if isinstance(t, dict) else ""
        t = t if isinstance(t, dict) else root
        self.path = path

        def get(key, obj=t, where=base):
            if key not in obj:
                raise RefError(f"{path}: missing key '{where}{key}'")
            return obj[key]

        def want(key, ok, obj=t, where=base):
            v = get(key, obj, where)
            if v not in ok:
                raise RefError(f"{path}: unsupported value {v!r} for '{where}{key}'")
            return v

        self.hidden = get("hidden_size")
        self.layers = get("num_hidden_layers")
        self.vocab = get("vocab_size")
        self.dense_inter = get("intermediate_size")
        self.first_dense = get("first_k_dense_replace")
        self.moe_freq = get("moe_layer_freq")
        self.mla_heads = get("num_attention_heads")
        if get("num_key_value_heads") != self.mla_heads:
            raise RefError(f"{path}: unsupported '{base}num_key_value_heads' != heads")
        self.q_lora = get("q_lora_rank")
        self.kv_lora = get("kv_lora_rank")
        self.nope = get("qk_nope_head_dim")
        self.extra = get("qk_rope_head_dim")
        self.v_dim = get("v_head_dim")
        want("mla_use_nope", [True])
        want("mla_use_output_gate", [True])
        la = get("linear_attn_config")
        lw = base + "linear_attn_config."
        self.kda_heads = get("num_heads", la, lw)
        self.kda_dim = get("head_dim", la, lw)
        self.conv = get("short_conv_kernel_size", la, lw)
        self.gate_lb = float(get("gate_lower_bound", la, lw))
        want("use_full_rank_gate", [True], la, lw)
        kda = list(get("kda_layers", la, lw))
        full = list(get("full_attn_layers", la, lw))
        if sorted(kda + full) != list(range(1, self.layers + 1)):
            raise RefError(f"{path}: '{lw}kda_layers' and '{lw}full_attn_layers' (1-based) must "
                           f"partition 1..{self.layers}")
        self.is_mla = [(i + 1) in full for i in range(self.layers)]
        self.experts = get("num_experts")
        self.top_k = get("num_experts_per_token")
        self.shared = get("num_shared_experts")
        self.moe_inter = get("moe_intermediate_size")
        self.latent = get("routed_expert_hidden_size")
        self.latent_norm = bool(get("latent_moe_use_norm"))
        want("moe_router_activation_func", ["sigmoid"])
        self.renorm = bool(get("moe_renormalize"))
        self.scaling = float(get("routed_scaling_factor"))
        want("num_expert_group", [1])
        want("topk_group", [1])
        want("topk_method", ["noaux_tc"])
        want("hidden_act", ["situ"])
        self.beta1 = float(get("activation_situ_beta"))
        self.beta2 = float(get("activation_situ_linear_beta"))
        self.block = get("attn_res_block_size")
        self.eps = float(get("rms_norm_eps"))
        self.tie = bool(t.get("tie_word_embeddings", root.get("tie_word_embeddings", False)))
        if self.top_k > self.experts or self.block < 1:
            raise RefError(f"{path}: inconsistent top-k/experts or attn_res_block_size")

    def is_moe(self, i):
        return i >= self.first_dense and i % self.moe_freq == 0


# ---------------------------------------------------------------------------------------------
# Layers. Each takes float64 row-major inputs [T, ...] and a dict of float64 weights.


def attnres_mix(cands, norm_w, proj_w, eps):
    """MIX (spec §3.2): cands [n+1, T, D] (snapshots in order, then the running prefix).
    score_j = (v_j . (norm_w * proj_w)) / sqrt(mean(v_j^2) + eps); softmax over j; sum of the
    raw candidates."""
    v = np.asarray(cands)
    s = norm_w * np.reshape(proj_w, -1)
    score = (v @ s) / np.sqrt(np.mean(v * v, axis=-1) + eps)          # [n+1, T]
    score -= score.max(axis=0, keepdims=True)
    p = np.exp(score)
    p /= p.sum(axis=0, keepdims=True)
    return np.einsum("jt,jtd->td", p, v)


def kda_layer(x, w, cfg, state=None):
    """Kimi Delta Attention (spec §3.3) over the rows of x [T, D] in order.

    w: q, k, v, g, o (matrices), q_conv, k_conv, v_conv [C, K], f_a, f_b, b, A_log, dt_bias,
    o_norm. state: None (sequence start) or {"conv": {"q","k","v": [K-1, C] raw projections},
    "S": [H, d, d]}; the updated state is returned with the output [T, D]."""
    T = x.shape[0]
    H, d, K = cfg.kda_heads, cfg.kda_dim, cfg.conv
    C = H * d
    if state is None:
        state = {"conv": {n: np.zeros((K - 1, C), x.dtype) for n in "qkv"},
                 "S": np.zeros((H, d, d), x.dtype)}
    new_conv, act = {}, {}
    for n in "qkv":
        raw = x @ w[n].T                                              # [T, C]
        full = np.concatenate([state["conv"][n], raw])                # [K-1+T, C]
        taps = w[n + "_conv"]                                         # [C, K] oldest->newest
        y = np.zeros((T, C), x.dtype)
        for j in range(K):
            y += full[j:j + T] * taps[:, j]
        act[n] = silu(y)
        new_conv[n] = full[T:] if K > 1 else full[:0]
    q = l2n(act["q"].reshape(T, H, d)) * d ** -0.5
    k = l2n(act["k"].reshape(T, H, d))
    v = act["v"].reshape(T, H, d)
    z = (x @ w["f_a"].T) @ w["f_b"].T + w["dt_bias"]                  # [T, C]
    a_head = np.repeat(np.exp(w["A_log"][:H]), d)                     # per head -> per channel
    alpha = np.exp(cfg.gate_lb * sigmoid(a_head * z)).reshape(T, H, d)
    beta = sigmoid(x @ w["b"].T)                                      # [T, H]
    S = state["S"].copy()
    o = np.zeros((T, H, d), x.dtype)
    for t in range(T):
        S *= alpha[t][:, :, None]                                     # S[i,:] *= alpha[i]
        e = v[t] - np.einsum("hi,hij->hj", k[t], S)                   # v - S^T k (decayed S)
        S += beta[t][:, None, None] * k[t][:, :, None] * e[:, None, :]
        o[t] = np.einsum("hi,hij->hj", q[t], S)                       # S^T q (updated S)
    gate = sigmoid(x @ w["g"].T).reshape(T, H, d)
    o = rms_norm(o, w["o_norm"], cfg.eps) * gate
    return o.reshape(T, C) @ w["o"].T, {"conv": new_conv, "S": S}


def _mla_inputs(x, w, cfg, mla_eps, cache):
    """Queries [T, H, nope+extra], the cache rows (earlier ones first) c [P+T, kv_lora] and
    kx [P+T, extra], and P, the number of earlier positions."""
    T, H = x.shape[0], cfg.mla_heads
    n, xd, kvr = cfg.nope, cfg.extra, cfg.kv_lora
    cq = rms_norm(x @ w["q_a"].T, w["q_a_norm"], mla_eps)
    Q = (cq @ w["q_b"].T).reshape(T, H, n + xd)
    kv = x @ w["kv_a"].T
    c, kx = rms_norm(kv[:, :kvr], w["kv_a_norm"], mla_eps), kv[:, kvr:]
    if cache is None:
        return Q, c, kx, 0
    past = cache["c"].shape[0]
    return Q, np.concatenate([cache["c"], c]), np.concatenate([cache["kx"], kx]), past


def _mla_finish(x, ctx, w, cfg):
    T = x.shape[0]
    gate = sigmoid(x @ w["g"].T).reshape(T, cfg.mla_heads, cfg.v_dim)
    return (ctx * gate).reshape(T, -1) @ w["o"].T


def _causal_softmax(s, past):
    """s [H, T, past+T]: row t may see columns 0 .. past+t."""
    T, S = s.shape[1], s.shape[2]
    mask = np.arange(S)[None, :] > (past + np.arange(T))[:, None]
    s = np.where(mask[None], -np.inf, s)
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    return p / p.sum(axis=-1, keepdims=True)


def mla_layer(x, w, cfg, mla_eps=1e-6, cache=None):
    """Gated NoPE MLA (spec §3.4), unabsorbed: explicit per-head keys and values.

    w: q_a, q_a_norm, q_b, kv_a, kv_a_norm, kv_b, g, o. cache: None or {"c": [P, kv_lora],
    "kx": [P, extra]} of earlier positions; returns (a [T, D], cache with these rows added)."""
    H, n, xd, vd, kvr = cfg.mla_heads, cfg.nope, cfg.extra, cfg.v_dim, cfg.kv_lora
    Q, c, kx, past = _mla_inputs(x, w, cfg, mla_eps, cache)
    kvb = w["kv_b"].reshape(H, n + vd, kvr)
    k_nope = np.einsum("sc,hnc->shn", c, kvb[:, :n])                   # [S, H, n]
    vals = np.einsum("sc,hvc->shv", c, kvb[:, n:])                    # [S, H, v]
    s = (np.einsum("thn,shn->hts", Q[..., :n], k_nope) +
         np.einsum("thx,sx->hts", Q[..., n:], kx)) / math.sqrt(n + xd)
    p = _causal_softmax(s, past)
    ctx = np.einsum("hts,shv->thv", p, vals)
    return _mla_finish(x, ctx, w, cfg), {"c": c, "kx": kx}


def mla_layer_absorbed(x, w, cfg, mla_eps=1e-6, cache=None):
    """The same MLA in the absorbed form over the 576-float latent cache: q_abs = K_h^T q_nope,
    s = (q_abs . c + q_x . k_x) / sqrt(nope + extra), ctx_h = V_h (sum_t p_t c_t)."""
    H, n, xd, vd, kvr = cfg.mla_heads, cfg.nope, cfg.extra, cfg.v_dim, cfg.kv_lora
    Q, c, kx, past = _mla_inputs(x, w, cfg, mla_eps, cache)
    kvb = w["kv_b"].reshape(H, n + vd, kvr)
    q_abs = np.einsum("thn,hnc->thc", Q[..., :n], kvb[:, :n])         # [T, H, kv_lora]
    s = (np.einsum("thc,sc->hts", q_abs, c) +
         np.einsum("thx,sx->hts", Q[..., n:], kx)) / math.sqrt(n + xd)
    p = _causal_softmax(s, past)
    lat = np.einsum("hts,sc->thc", p, c)
    ctx = np.einsum("thc,hvc->thv", lat, kvb[:, n:])
    return _mla_finish(x, ctx, w, cfg), {"c": c, "kx": kx}


def dense_mlp(x, w, cfg):
    """Dense SiTU MLP of layer 0 (spec §3.5): w = gate, up, down."""
    return glu(x, w["gate"], w["up"], w["down"], cfg.beta1, cfg.beta2)


def route(x, w, cfg):
    """Router (spec §3.6 steps 1-3): returns (ids [T, k], weights [T, k], scores [T, E]).
    Selection on sigmoid + bias, lowest index first on exact ties (stable sort); weights from
    the sigmoid alone, renormalized, times routed_scaling_factor."""
    s = sigmoid(x @ w["router"].T)
    choose = s + w["bias"]
    ids = np.argsort(-choose, axis=1, kind="stable")[:, :cfg.top_k]
    sel = np.take_along_axis(s, ids, axis=1)
    if cfg.renorm:
        sel = sel / (sel.sum(axis=1, keepdims=True) + 1e-20)
    return ids, sel * cfg.scaling, s


def latent_moe(x, w, cfg, expert):
    """LatentMoE (spec §3.6). w: router, bias, down_lat, lat_norm, up_lat, sh_gate, sh_up,
    sh_down. expert(e) -> (W1 [inter, latent], W2 [latent, inter], W3 [inter, latent]) f64."""
    ids, weights, _ = route(x, w, cfg)
    z = x @ w["down_lat"].T                                           # [T, latent]
    u = np.zeros_like(z)
    for e in np.unique(ids):
        rows, ks = np.nonzero(ids == e)
        w1, w2, w3 = expert(int(e))
        zr = z[rows]
        out = situ(zr @ w1.T, zr @ w3.T, cfg.beta1, cfg.beta2) @ w2.T
        u[rows] += weights[rows, ks][:, None] * out
    if cfg.latent_norm:
        u = rms_norm(u, w["lat_norm"], cfg.eps)
    y = u @ w["up_lat"].T
    return y + glu(x, w["sh_gate"], w["sh_up"], w["sh_down"], cfg.beta1, cfg.beta2)


def attnres_stack(x0, n_layers, block, attn, ffn, mix):
    """The AttnRes control flow of spec §3.1, with the sublayers as callables:
    attn(i, h) and ffn(i, m) return the sublayer output for the (un-normalized) mixed input,
    mix(i, site, cands) mixes the candidates [n+1, T, D] (site "attn_res", "mlp_res" or "out").
    Returns (out = the final mix, trace [T, N, D]): trace[:, i] is h at the end of layer i, the
    in-block running sum after the FFN (not a mix)."""
    h = x0
    trace = np.zeros((x0.shape[0], n_layers, x0.shape[1]), x0.dtype)
    blocks = []                                   # snapshots, in append order
    for i in range(n_layers):
        prefix = h                                # running in-block sum
        if blocks:
            h = mix(i, "attn_res", np.stack(blocks + [prefix]))
        if i % block == 0:                        # close the previous block (x0 at i = 0)
            blocks.append(prefix)
            prefix = None
        a = attn(i, h)
        prefix = a if prefix is None else prefix + a
        m = mix(i, "mlp_res", np.stack(blocks + [prefix]))
        prefix = prefix + ffn(i, m)
        h = prefix
        trace[:, i] = h
    return mix(None, "out", np.stack(blocks + [h])), trace


# ---------------------------------------------------------------------------------------------
# The model: expected tensors (spec §2.3) and the forward pass (spec §3.1)


class Model:
    def __init__(self, model_dir, mla_eps=1e-6, dtype=np.float64, bits=32, mla_bits=32,
                 head_bits=32):
        """dtype float32 emulates an all-f32 engine (self-tests only; the reference is float64).
        bits / mla_bits / head_bits: emulate the engine's load-time quantization (32 = exact)."""
        self.dtype = dtype
        for b in (bits, mla_bits, head_bits):
            if b not in (4, 8, 32):
                raise RefError(f"unsupported bits {b} (4, 8 or 32)")
        self.bits, self.mla_bits, self.head_bits = bits, mla_bits, head_bits
        self.cfg = Config(os.path.join(model_dir, "config.json"))
        self.snap = Snapshot(model_dir)
        self.mla_eps = mla_eps
        self._layers = {}
        self._experts = {}
        c = self.cfg
        D = c.hidden
        self.embed_name = "model.embed_tokens.weight"
        self.snap.raw(self.embed_name, "BF16", [c.vocab, D])
        get = self.snap.f64
        self.final_norm = get("model.norm.weight", "BF16", [D]).astype(dtype)
        self.out_norm = get("model.output_attn_res_norm.weight", "BF16", [D]).astype(dtype)
        self.out_proj = get("model.output_attn_res_proj.weight", "BF16", [1, D]).astype(dtype)
        head = self.embed_name if c.tie and not self.snap.has("lm_head.weight") else \
            "lm_head.weight"
        self.lm_head = quantize_dequant(get(head, "BF16", [c.vocab, D]), head_bits).astype(dtype)

    def embed(self, ids):
        table = self.snap.raw(self.embed_name, "BF16", [self.cfg.vocab, self.cfg.hidden])
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.cfg.vocab):
            raise RefError(f"token id out of range [0, {self.cfg.vocab})")
        return to_f64(table[ids], self.snap.stored_dtype(self.embed_name)).astype(self.dtype)

    def layer(self, i):
        """Float64 weights of layer i, each checked against its expected dtype and shape."""
        if i in self._layers:
            return self._layers[i]
        c = self.cfg
        if not 0 <= i < c.layers:
            raise RefError(f"layer {i} out of range [0, {c.layers})")
        D, P = c.hidden, f"model.layers.{i}"

        def get(name, dtype, shape):
            return self.snap.f64(name, dtype, shape).astype(self.dtype)

        def quantize(group, keys, bits):
            for k in keys:
                group[k] = quantize_dequant(group[k].astype(np.float64), bits).astype(self.dtype)
        L = {
            "in_norm": get(f"{P}.input_layernorm.weight", "BF16", [D]),
            "post_norm": get(f"{P}.post_attention_layernorm.weight", "BF16", [D]),
            "attn_res_norm": get(f"{P}.self_attention_res_norm.weight", "BF16", [D]),
            "attn_res_proj": get(f"{P}.self_attention_res_proj.weight", "BF16", [1, D]),
            "mlp_res_norm": get(f"{P}.mlp_res_norm.weight", "BF16", [D]),
            "mlp_res_proj": get(f"{P}.mlp_res_proj.weight", "BF16", [1, D]),
        }
        A = f"{P}.self_attn"
        if c.is_mla[i]:
            H, n, x, v = c.mla_heads, c.nope, c.extra, c.v_dim
            L["attn"] = {
                "q_a": get(f"{A}.q_a_proj.weight", "BF16", [c.q_lora, D]),
                "q_a_norm": get(f"{A}.q_a_layernorm.weight", "BF16", [c.q_lora]),
                "q_b": get(f"{A}.q_b_proj.weight", "BF16", [H * (n + x), c.q_lora]),
                "kv_a": get(f"{A}.kv_a_proj_with_mqa.weight", "BF16", [c.kv_lora + x, D]),
                "kv_a_norm": get(f"{A}.kv_a_layernorm.weight", "BF16", [c.kv_lora]),
                "kv_b": get(f"{A}.kv_b_proj.weight", "BF16", [H * (n + v), c.kv_lora]),
                "g": get(f"{A}.g_proj.weight", "BF16", [H * v, D]),
                "o": get(f"{A}.o_proj.weight", "BF16", [D, H * v]),
            }
        else:
            H, d, K = c.kda_heads, c.kda_dim, c.conv
            C = H * d
            a_len = self.snap.info(f"{A}.A_log")[1]
            if len(a_len) != 1 or a_len[0] < H:
                raise RefError(f"tensor '{self.snap.prefix}{A}.A_log': expected F32 [{H}] "
                               f"(or zero-padded longer), got {a_len}")
            a_log = get(f"{A}.A_log", "F32", a_len)
            if np.any(a_log[H:] != 0):
                raise RefError(f"tensor '{self.snap.prefix}{A}.A_log': entries {H}.. must be "
                               f"0 (per-head padding, spec §3.9)")
            f_rank = self.snap.info(f"{A}.f_a_proj.weight")[1][0]
            L["attn"] = {
                "q": get(f"{A}.q_proj.weight", "BF16", [C, D]),
                "k": get(f"{A}.k_proj.weight", "BF16", [C, D]),
                "v": get(f"{A}.v_proj.weight", "BF16", [C, D]),
                "q_conv": get(f"{A}.q_conv1d.weight", "F32", [C, 1, K]).reshape(C, K),
                "k_conv": get(f"{A}.k_conv1d.weight", "F32", [C, 1, K]).reshape(C, K),
                "v_conv": get(f"{A}.v_conv1d.weight", "F32", [C, 1, K]).reshape(C, K),
                "f_a": get(f"{A}.f_a_proj.weight", "BF16", [f_rank, D]),
                "f_b": get(f"{A}.f_b_proj.weight", "BF16", [C, f_rank]),
                "b": get(f"{A}.b_proj.weight", "BF16", [H, D]),
                "A_log": a_log,
                "dt_bias": get(f"{A}.dt_bias", "F32", [C]),
                "o_norm": get(f"{A}.o_norm.weight", "F32", [d]),
                "g": get(f"{A}.g_proj.weight", "BF16", [C, D]),
                "o": get(f"{A}.o_proj.weight", "BF16", [D, C]),
            }
        if not c.is_moe(i):
            I, M = c.dense_inter, f"{P}.mlp"
            L["ffn"] = {
                "gate": get(f"{M}.gate_proj.weight", "BF16", [I, D]),
                "up": get(f"{M}.up_proj.weight", "BF16", [I, D]),
                "down": get(f"{M}.down_proj.weight", "BF16", [D, I]),
            }
        else:
            E, lat, S, M = c.experts, c.latent, c.shared * c.moe_inter, f"{P}.block_sparse_moe"
            L["ffn"] = {
                "router": get(f"{M}.gate.weight", "BF16", [E, D]),
                "bias": get(f"{M}.gate.e_score_correction_bias", "F32", [E]),
                "down_lat": get(f"{M}.routed_expert_down_proj.weight", "BF16", [lat, D]),
                "lat_norm": get(f"{M}.routed_expert_norm.weight", "BF16", [lat]),
                "up_lat": get(f"{M}.routed_expert_up_proj.weight", "BF16", [D, lat]),
                "sh_gate": get(f"{M}.shared_experts.gate_proj.weight", "BF16", [S, D]),
                "sh_up": get(f"{M}.shared_experts.up_proj.weight", "BF16", [S, D]),
                "sh_down": get(f"{M}.shared_experts.down_proj.weight", "BF16", [D, S]),
            }
        if c.is_mla[i]:
            quantize(L["attn"], MLA_BITS_KEYS, self.mla_bits)
        else:
            quantize(L["attn"], BITS_KEYS["kda"], self.bits)
        quantize(L["ffn"], BITS_KEYS["moe" if c.is_moe(i) else "dense"], self.bits)
        self._layers[i] = L
        return L

    def expert_names(self, i, e):
        """The six tensor names of expert e of layer i, in the on-disk order of spec §2.4."""
        E = f"model.layers.{i}.block_sparse_moe.experts.{e}"
        return [f"{E}.{m}.weight_{k}" for m in ("w1", "w2", "w3") for k in ("packed", "scale")]

    def expert(self, i, e):
        """(W1, W2, W3) of expert e in layer i, dequantized exactly (cached when small)."""
        key = (i, e)
        if key in self._experts:
            return self._experts[key]
        c = self.cfg
        if not 0 <= e < c.experts:
            raise RefError(f"expert {e} out of range [0, {c.experts})")
        shapes = {"w1": (c.moe_inter, c.latent), "w2": (c.latent, c.moe_inter),
                  "w3": (c.moe_inter, c.latent)}
        E = f"model.layers.{i}.block_sparse_moe.experts.{e}"
        out = []
        plain = [self.snap.has(f"{E}.{m}.weight") for m in ("w1", "w2", "w3")]
        packed = [self.snap.has(f"{E}.{m}.weight_{k}") for m in ("w1", "w2", "w3")
                  for k in ("packed", "scale")]
        if any(plain):
            # Unquantized experts (spec §9.8: a vendor save with experts kept in f32): plain
            # F32 linear weights of the logical shapes; never mixed with MXFP4 parts.
            if any(packed):
                raise RefError(f"tensor '{self.snap.prefix}{E}.w1.weight': expert {e} mixes "
                               f"plain weights with MXFP4 weight_packed/weight_scale")
            for m in ("w1", "w2", "w3"):
                out.append(self.snap.f64(f"{E}.{m}.weight", "F32", shapes[m]))
            out = tuple(m.astype(self.dtype) for m in out)
            if c.latent * c.moe_inter <= 1 << 20:
                self._experts[key] = out
            return out
        for m in ("w1", "w2", "w3"):
            o, n = shapes[m]
            if n % 32:
                raise RefError(f"{E}.{m}: input width {n} is not a multiple of 32")
            packed = self.snap.raw(f"{E}.{m}.weight_packed", "U8", [o, n // 2])
            scale = self.snap.raw(f"{E}.{m}.weight_scale", "U8", [o, n // 32])
            out.append(mxfp4_dequant(packed, scale))
        out = tuple(m.astype(self.dtype) for m in out)
        if c.latent * c.moe_inter <= 1 << 20:
            self._experts[key] = out
        return out

    def ffn(self, i, x):
        L = self.layer(i)
        if self.cfg.is_moe(i):
            return latent_moe(x, L["ffn"], self.cfg, lambda e: self.expert(i, e))
        return dense_mlp(x, L["ffn"], self.cfg)

    def attn(self, i, x, state=None):
        L = self.layer(i)
        if self.cfg.is_mla[i]:
            return mla_layer(x, L["attn"], self.cfg, self.mla_eps, state)
        return kda_layer(x, L["attn"], self.cfg, state)

    def forward(self, x0, n_layers=None, state=None, sublayers=None):
        """Spec §3.1 over the rows x0 [T, D] (consecutive positions). state: None (start) or the
        list of per-layer states returned by an earlier call, continued in place. Returns
        (logits [T, V], trace [T, N, D] = h after each layer, new state). If `sublayers` is an
        array [T, N, 2, D], the attention and FFN outputs of each layer are stored in it."""
        c = self.cfg
        N = c.layers if n_layers is None else n_layers
        if not 1 <= N <= c.layers:
            raise RefError(f"layers {N} out of range [1, {c.layers}]")
        state = [None] * N if state is None else state

        def attn(i, x):
            a, state[i] = self.attn(i, rms_norm(x, self.layer(i)["in_norm"], c.eps), state[i])
            if sublayers is not None:
                sublayers[:, i, 0] = a
            return a

        def ffn(i, x):
            f = self.ffn(i, rms_norm(x, self.layer(i)["post_norm"], c.eps))
            if sublayers is not None:
                sublayers[:, i, 1] = f
            return f

        def mix(i, site, cands):
            if site == "out":
                return attnres_mix(cands, self.out_norm, self.out_proj, c.eps)
            L = self.layer(i)
            return attnres_mix(cands, L[site + "_norm"], L[site + "_proj"], c.eps)

        out, trace = attnres_stack(np.asarray(x0, dtype=self.dtype), N, c.block, attn, ffn, mix)
        logits = rms_norm(out, self.final_norm, c.eps) @ self.lm_head.T
        return logits, trace, state

    def greedy(self, ids, n, n_layers=None):
        """Prompt logits and n greedy continuation ids (first index of the max), decoding one
        token at a time on the carried state."""
        logits, _, state = self.forward(self.embed(ids), n_layers)
        return logits, self.decode(logits, state, n, n_layers)

    def decode(self, logits, state, n, n_layers=None):
        """n greedy ids continuing a forward pass that returned logits and state."""
        out = []
        for _ in range(n):
            nxt = int(np.argmax(logits[-1]))
            out.append(nxt)
            logits, _, state = self.forward(self.embed([nxt]), n_layers, state)
        return out

    def check(self):
        """Reads every text tensor the model uses (all layers, all experts) with its checks."""
        for i in range(self.cfg.layers):
            self.layer(i)
            if self.cfg.is_moe(i):
                for e in range(self.cfg.experts):
                    self.expert(i, e)
        self._experts.clear()


# ---------------------------------------------------------------------------------------------
# Command line


def _read_rows(path, width, rows=None):
    if path.endswith(".npy"):
        a = np.load(path).astype(np.float64)
    else:
        a = np.fromfile(path, dtype="<f4").astype(np.float64)
    if a.size % width:
        raise RefError(f"{path}: {a.size} values is not a multiple of the width {width}")
    a = a.reshape(-1, width)
    if rows is not None and a.shape[0] % rows:
        raise RefError(f"{path}: {a.shape[0]} rows of {width} do not split into {rows} rows")
    return a


def _write_f32(path, a):
    np.ascontiguousarray(a, dtype="<f4").tofile(path)


def cmd_run(a):
    model = Model(a.model, a.mla_eps, bits=a.bits, mla_bits=a.mla_bits, head_bits=a.head_bits)
    c = model.cfg
    if (a.ids is None) == (a.x0 is None):
        raise RefError("give exactly one of --ids and --x0")
    if a.x0 is not None:
        x0 = _read_rows(a.x0, c.hidden)
        if a.rows is not None and x0.shape[0] != a.rows:
            raise RefError(f"{a.x0}: {x0.shape[0]} rows, --rows says {a.rows}")
        if a.greedy:
            raise RefError("--greedy needs --ids")
        ids = None
    else:
        try:
            ids = [int(t) for t in a.ids.split(",") if t.strip()]
        except ValueError as e:
            raise RefError(f"--ids: {e}") from e
        if not ids:
            raise RefError("--ids is empty")
        x0 = model.embed(ids)
    N = a.layers or c.layers
    subs = np.zeros((x0.shape[0], N, 2, c.hidden)) if a.out_sublayers else None
    logits, trace, state = model.forward(x0, a.layers, sublayers=subs)
    if a.out_logits:
        _write_f32(a.out_logits, logits)
    if a.out_trace:
        _write_f32(a.out_trace, trace)
    if a.out_sublayers:
        _write_f32(a.out_sublayers, subs)
    if a.greedy:
        print(json.dumps({"ids": model.decode(logits, state, a.greedy, a.layers)}))
    elif not (a.out_logits or a.out_trace or a.out_sublayers):
        print(json.dumps({"argmax": [int(j) for j in np.argmax(logits, axis=1)]}))


LAYER_KINDS = ("attn", "ffn", "kda", "mla", "dense", "moe", "router", "expert", "mix_attn",
               "mix_mlp", "mix_out")


def cmd_layer(a):
    model = Model(a.model, a.mla_eps, bits=a.bits, mla_bits=a.mla_bits)
    c, i, kind = model.cfg, a.layer, a.kind
    if kind != "mix_out":
        L = model.layer(i)
    if kind == "attn":
        kind = "mla" if c.is_mla[i] else "kda"
    if kind == "ffn":
        kind = "moe" if c.is_moe(i) else "dense"
    if (kind == "mla") != c.is_mla[i] and kind in ("kda", "mla"):
        raise RefError(f"layer {i} is not a {kind} layer")
    if kind in ("moe", "dense", "router", "expert") and (kind != "dense") != c.is_moe(i):
        raise RefError(f"layer {i} is not a {'dense' if kind == 'dense' else 'MoE'} layer")
    if kind == "router":
        x = _read_rows(getattr(a, "in"), c.hidden, a.rows)
        if a.prenorm:
            x = rms_norm(x, L["post_norm"], c.eps)
        ids, weights, _ = route(x, L["ffn"], c)
        print(json.dumps({"ids": ids.tolist(), "weights": weights.tolist()}))
        return
    if kind == "expert":
        if a.expert is None:
            raise RefError("--expert is required for kind expert")
        z = _read_rows(getattr(a, "in"), c.latent, a.rows)
        w1, w2, w3 = model.expert(i, a.expert)
        y = situ(z @ w1.T, z @ w3.T, c.beta1, c.beta2) @ w2.T
    elif kind.startswith("mix_"):
        if a.rows is None:
            raise RefError("--rows is required for mix kinds (the number of positions)")
        v = _read_rows(getattr(a, "in"), c.hidden)
        cands = v.reshape(-1, a.rows, c.hidden)
        if kind == "mix_out":
            y = attnres_mix(cands, model.out_norm, model.out_proj, c.eps)
        else:
            site = "attn_res" if kind == "mix_attn" else "mlp_res"
            y = attnres_mix(cands, L[site + "_norm"], L[site + "_proj"], c.eps)
    else:
        x = _read_rows(getattr(a, "in"), c.hidden, a.rows)
        if a.prenorm:
            x = rms_norm(x, L["in_norm"] if kind in ("kda", "mla") else L["post_norm"], c.eps)
        if kind in ("kda", "mla"):
            y, _ = model.attn(i, x)
        else:
            y = model.ffn(i, x)
    if a.out:
        _write_f32(a.out, y)
    else:
        print(json.dumps({"shape": list(y.shape), "rms": float(np.sqrt(np.mean(y * y)))}))


def main(argv=None):
    ap = argparse.ArgumentParser(description="Kimi K3 float64 numpy reference (spec §3)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="the whole stack on token ids or injected rows")
    r.add_argument("--model", required=True)
    r.add_argument("--ids", help="comma-separated token ids")
    r.add_argument("--x0", help="raw f32 [T, hidden] rows replacing the embedding (or .npy)")
    r.add_argument("--rows", type=int, help="T, checked against --x0")
    r.add_argument("--layers", type=int, help="run layers 0..N-1 only")
    r.add_argument("--out-logits", help="f32 LE [T x vocab], every position")
    r.add_argument("--out-trace", help="f32 LE [T, N, hidden], h after each layer")
    r.add_argument("--out-sublayers", help="f32 LE [T, N, 2, hidden]: attention, FFN outputs")
    r.add_argument("--mla-eps", type=float, default=1e-6)
    r.add_argument("--greedy", type=int, default=0, help="print N greedy ids as JSON")
    r.add_argument("--head-bits", type=int, default=32, help="emulate K3_HEAD_BITS (4, 8, 32)")
    ly = sub.add_parser("layer", help="one sublayer on given inputs")
    ly.add_argument("--model", required=True)
    ly.add_argument("--layer", type=int, default=0)
    ly.add_argument("--kind", required=True, choices=LAYER_KINDS)
    ly.add_argument("--in", required=True, help="raw f32 or .npy input rows")
    ly.add_argument("--rows", type=int)
    ly.add_argument("--expert", type=int, help="expert id for kind expert (input: latent rows)")
    ly.add_argument("--out", help="raw f32 output")
    ly.add_argument("--prenorm", action="store_true",
                    help="apply the layer's input/post-attention RMSNorm to the input first")
    ly.add_argument("--mla-eps", type=float, default=1e-6)
    for p in (r, ly):
        p.add_argument("--bits", type=int, default=32, help="emulate K3_BITS (4, 8, 32)")
        p.add_argument("--mla-bits", type=int, default=32, help="emulate K3_MLA_BITS")
    ch = sub.add_parser("check", help="read and validate every text tensor")
    ch.add_argument("--model", required=True)
    a = ap.parse_args(argv)
    try:
        if a.cmd == "run":
            cmd_run(a)
        elif a.cmd == "layer":
            cmd_layer(a)
        else:
            Model(a.model).check()
            print("ok")
    except RefError as e:
        print(f"k3_ref: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"k3_ref: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
