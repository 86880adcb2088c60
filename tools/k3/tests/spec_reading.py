"""A third reading of the Kimi K3 forward pass (spec kimi_k3_model.md §3), written by the
independent audit of the K3 math (issue 10) from the spec text alone and in another shape than
k3_ref.py: one token at a time through the whole stack, loops per head, per cached position and
per AttnRes candidate, the spec's own variable names, its own safetensors reading and an e2m1
decode from the code's bits. test_spec_reading.py holds k3_ref.py (and through it the engine,
whose tests compare with k3_ref.py) to it. Slow by design; for the tiny fixtures only."""

import json
import os
import struct

import numpy as np


def tensor_reader(snapshot_dir):
    """name (without the 'language_model.' prefix) -> (values, dtype) from the index's shards:
    BF16 and F32 as float64, U8 as uint8."""
    with open(os.path.join(snapshot_dir, "model.safetensors.index.json")) as f:
        weight_map = json.load(f)["weight_map"]
    headers = {}

    def read(name):
        full = next((p + name for p in ("language_model.", "") if p + name in weight_map), None)
        if full is None:
            raise KeyError(name)
        path = os.path.join(snapshot_dir, weight_map[full])
        with open(path, "rb") as f:
            if path not in headers:
                n = struct.unpack("<Q", f.read(8))[0]
                headers[path] = (json.loads(f.read(n)), 8 + n)
            header, data_start = headers[path]
            entry = header[full]
            begin, end = entry["data_offsets"]
            f.seek(data_start + begin)
            raw = f.read(end - begin)
        dtype = entry["dtype"]
        if dtype == "BF16":
            values = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
        elif dtype == "F32":
            values = np.frombuffer(raw, "<f4")
        elif dtype == "U8":
            return np.frombuffer(raw, np.uint8).reshape(entry["shape"]), dtype
        else:
            raise ValueError(f"{full}: dtype {dtype}")
        return values.astype(np.float64).reshape(entry["shape"]), dtype

    return read


def sigma(x):
    return 1.0 / (1.0 + np.exp(-x))


def rms_norm(x, w, eps):
    """§3.0: x / sqrt(mean(x²) + ε) · w (one vector)."""
    return x / np.sqrt(np.mean(x * x) + eps) * w


def situ(g, u, beta1, beta2):
    """§3.0: β1·tanh(g/β1)·σ(g) · β2·tanh(u/β2)."""
    return beta1 * np.tanh(g / beta1) * sigma(g) * (beta2 * np.tanh(u / beta2))


def mxfp4(packed, scale):
    """§4.1 from the bits: code = sign (bit 3) | exponent (bits 2-1) | mantissa (bit 0), exponent
    bias 1, exponent 0 subnormal (0, 0.5); low nibble = even column; · 2^(s − 127) per 32."""
    codes = np.stack([packed & 15, packed >> 4], axis=-1).reshape(packed.shape[0], -1)
    sign = np.where(codes & 8, -1.0, 1.0)
    e, m = (codes >> 1) & 3, codes & 1
    magnitude = np.where(e == 0, 0.5 * m, np.exp2(e.astype(np.float64) - 1) * (1 + 0.5 * m))
    return sign * magnitude * np.repeat(np.exp2(scale.astype(np.float64) - 127), 32, axis=1)


class SpecReading:
    """The model of one snapshot folder; run(ids) -> logits [T, V], one token at a time."""

    def __init__(self, snapshot_dir, mla_eps=1e-6):
        with open(os.path.join(snapshot_dir, "config.json")) as f:
            root = json.load(f)
        self.t = root["text_config"] if isinstance(root.get("text_config"), dict) else root
        self.lin = self.t["linear_attn_config"]
        self.read = tensor_reader(snapshot_dir)
        self.mla_eps = mla_eps
        self.eps = self.t["rms_norm_eps"]
        self.n_layers = self.t["num_hidden_layers"]
        # §1.3: 1-based lists; MLA ⇔ (i+1) ∈ full_attn_layers, KDA ⇔ (i+1) ∈ kda_layers.
        self.is_mla = [(i + 1) in self.lin["full_attn_layers"] for i in range(self.n_layers)]
        for i in range(self.n_layers):
            if ((i + 1) in self.lin["kda_layers"]) == self.is_mla[i]:
                raise ValueError(f"layer {i + 1} (1-based) is not in exactly one list")
        self.cache = {}

    def w(self, name):
        if name not in self.cache:
            self.cache[name] = self.read(name)[0]
        return self.cache[name]

    def expert(self, i, e, which):
        key = ("expert", i, e, which)
        if key not in self.cache:
            base = f"model.layers.{i}.block_sparse_moe.experts.{e}.{which}."
            self.cache[key] = mxfp4(self.w(base + "weight_packed"), self.w(base + "weight_scale"))
        return self.cache[key]

    def new_state(self):
        """§3.1: per KDA layer the state S and the raw projections of the last K−1 tokens (zeros
        before the sequence start); per MLA layer the cached (c_t, k_x_t) rows."""
        H, d, K = self.lin["num_heads"], self.lin["head_dim"], self.lin["short_conv_kernel_size"]
        state = []
        for i in range(self.n_layers):
            if self.is_mla[i]:
                state.append({"rows": []})
            else:
                state.append({"window": {n: [np.zeros(H * d)] * (K - 1) for n in "qkv"},
                              "S": np.zeros((H, d, d))})
        return state

    def kda(self, i, x, st):
        """§3.3 for one token."""
        H, d, K = self.lin["num_heads"], self.lin["head_dim"], self.lin["short_conv_kernel_size"]
        A = f"model.layers.{i}.self_attn."
        y = {}
        for n in "qkv":
            window = st["window"][n] + [self.w(A + f"{n}_proj.weight") @ x]  # x_{t−K+1} … x_t
            taps = self.w(A + f"{n}_conv1d.weight")                          # [C, 1, K]
            conv = sum(taps[:, 0, j] * window[j] for j in range(K))
            y[n] = conv * sigma(conv)                                        # SiLU
            st["window"][n] = window[1:]
        graw = self.w(A + "f_b_proj.weight") @ (self.w(A + "f_a_proj.weight") @ x)
        blog = self.w(A + "b_proj.weight") @ x
        gout = self.w(A + "g_proj.weight") @ x
        a_log, dt_bias = self.w(A + "A_log"), self.w(A + "dt_bias")
        o_all = np.zeros(H * d)
        for h in range(H):
            c = slice(h * d, (h + 1) * d)
            q = y["q"][c] / np.sqrt(np.sum(y["q"][c] ** 2) + 1e-6) * d ** -0.5
            k = y["k"][c] / np.sqrt(np.sum(y["k"][c] ** 2) + 1e-6)
            v = y["v"][c]
            g = self.lin["gate_lower_bound"] * sigma(np.exp(a_log[h]) * (graw[c] + dt_bias[c]))
            st["S"][h], o = self.delta_rule(st["S"][h], q, k, v, np.exp(g), sigma(blog[h]))
            o_all[c] = rms_norm(o, self.w(A + "o_norm.weight"), self.eps) * sigma(gout[c])
        return self.w(A + "o_proj.weight") @ o_all

    @staticmethod
    def delta_rule(S, q, k, v, alpha, beta):
        """§3.3 step 6, in the spec's order; returns (new S, o)."""
        S = alpha[:, None] * S                               # S ← diag(α) S
        e = v - S.T @ k                                      # e = v − Sᵀk (decayed S)
        S = S + beta * np.outer(k, e)                        # S ← S + β k eᵀ
        return S, S.T @ q                                    # o = Sᵀq (updated S)

    def mla(self, i, x, st):
        """§3.4 for one token, unabsorbed: keys and values per head and cached position."""
        t = self.t
        H, nope, extra = t["num_attention_heads"], t["qk_nope_head_dim"], t["qk_rope_head_dim"]
        vd, rank = t["v_head_dim"], t["kv_lora_rank"]
        A = f"model.layers.{i}.self_attn."
        cq = rms_norm(self.w(A + "q_a_proj.weight") @ x, self.w(A + "q_a_layernorm.weight"),
                      self.mla_eps)
        Q = (self.w(A + "q_b_proj.weight") @ cq).reshape(H, nope + extra)
        kv = self.w(A + "kv_a_proj_with_mqa.weight") @ x
        st["rows"].append((rms_norm(kv[:rank], self.w(A + "kv_a_layernorm.weight"), self.mla_eps),
                           kv[rank:]))
        kv_b = self.w(A + "kv_b_proj.weight")
        gate = sigma(self.w(A + "g_proj.weight") @ x)
        ctx = np.zeros(H * vd)
        for h in range(H):
            K_h = kv_b[h * (nope + vd):h * (nope + vd) + nope]
            V_h = kv_b[h * (nope + vd) + nope:(h + 1) * (nope + vd)]
            s = np.array([(Q[h, :nope] @ (K_h @ c_t) + Q[h, nope:] @ k_x) / np.sqrt(nope + extra)
                          for c_t, k_x in st["rows"]])
            p = np.exp(s - s.max())
            p /= p.sum()
            ctx_h = sum(p_t * (V_h @ c_t) for p_t, (c_t, _) in zip(p, st["rows"]))
            ctx[h * vd:(h + 1) * vd] = ctx_h * gate[h * vd:(h + 1) * vd]
        return self.w(A + "o_proj.weight") @ ctx

    def ffn(self, i, x):
        """§3.5 (layers < first_k_dense_replace) or §3.6 for one token."""
        t = self.t
        b1, b2 = t["activation_situ_beta"], t["activation_situ_linear_beta"]
        if i < t["first_k_dense_replace"]:
            M = f"model.layers.{i}.mlp."
            return self.w(M + "down_proj.weight") @ situ(
                self.w(M + "gate_proj.weight") @ x, self.w(M + "up_proj.weight") @ x, b1, b2)
        M = f"model.layers.{i}.block_sparse_moe."
        weight = self.route(self.w(M + "gate.weight") @ x,
                            self.w(M + "gate.e_score_correction_bias"))
        z = self.w(M + "routed_expert_down_proj.weight") @ x
        u = np.zeros_like(z)
        for e in weight:
            u += weight[e] * (self.expert(i, e, "w2") @ situ(
                self.expert(i, e, "w1") @ z, self.expert(i, e, "w3") @ z, b1, b2))
        y = self.w(M + "routed_expert_up_proj.weight") @ rms_norm(
            u, self.w(M + "routed_expert_norm.weight"), self.eps)
        S = M + "shared_experts."
        return y + self.w(S + "down_proj.weight") @ situ(
            self.w(S + "gate_proj.weight") @ x, self.w(S + "up_proj.weight") @ x, b1, b2)

    def route(self, r, bias):
        """§3.6 steps 1-3: {expert: weight} of the top-k by σ(r) + bias (lowest index first on
        ties), weights σ(r) renormalised over the chosen, times routed_scaling_factor."""
        t = self.t
        s = sigma(r)
        choice = s + bias
        chosen = sorted(range(t["num_experts"]), key=lambda e: (-choice[e], e))
        chosen = chosen[:t["num_experts_per_token"]]
        total = sum(s[e] for e in chosen)
        return {e: s[e] / (total + 1e-20) * t["routed_scaling_factor"] for e in chosen}

    def mix(self, blocks, p, norm, proj):
        """§3.2 MIX over [blocks…, p]."""
        s = self.w(norm) * self.w(proj)[0]
        candidates = blocks + [p]
        score = np.array([(v @ s) / np.sqrt(np.mean(v * v) + self.eps) for v in candidates])
        pi = np.exp(score - score.max())
        pi /= pi.sum()
        return sum(pi_j * v_j for pi_j, v_j in zip(pi, candidates))

    def token(self, h, state):
        """§3.1 for one token's embedding row h; returns its logits."""
        block_size = self.t["attn_res_block_size"]
        blocks = []
        for i in range(self.n_layers):
            P = f"model.layers.{i}."
            prefix = h
            if blocks:
                h = self.mix(blocks, prefix, P + "self_attention_res_norm.weight",
                             P + "self_attention_res_proj.weight")
            if i % block_size == 0:
                blocks.append(prefix)
                prefix = None
            x = rms_norm(h, self.w(P + "input_layernorm.weight"), self.eps)
            a = self.mla(i, x, state[i]) if self.is_mla[i] else self.kda(i, x, state[i])
            prefix = a if prefix is None else prefix + a
            m = self.mix(blocks, prefix, P + "mlp_res_norm.weight", P + "mlp_res_proj.weight")
            prefix = prefix + self.ffn(
                i, rms_norm(m, self.w(P + "post_attention_layernorm.weight"), self.eps))
            h = prefix
        out = self.mix(blocks, h, "model.output_attn_res_norm.weight",
                       "model.output_attn_res_proj.weight")
        return self.w("lm_head.weight") @ rms_norm(out, self.w("model.norm.weight"), self.eps)

    def run(self, ids):
        state = self.new_state()
        table = self.w("model.embed_tokens.weight")
        return np.array([self.token(table[t].copy(), state) for t in ids])
