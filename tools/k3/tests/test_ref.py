"""Self-tests of the Kimi K3 numpy reference and the fixture maker (ctest label `reference`).

Each numeric check compares the reference with a second, differently written formulation
(closed forms, the absorbed MLA, bit-level e2m1 decoding, an incremental decode), and each
fixture check re-reads the written files byte by byte. Run:
  /usr/bin/python3 -m unittest discover -s tools/k3/tests -v
"""

import base64
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import types
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
TOOLS = os.path.dirname(HERE)
sys.path.insert(0, TOOLS)

import k3_ref as R  # noqa: E402
import make_fixture as F  # noqa: E402

_TMP = None


def setUpModule():
    global _TMP
    _TMP = tempfile.mkdtemp(prefix="k3_ref_test_")
    F.build(os.path.join(_TMP, "tiny"), "tiny", log=None)
    F.build(os.path.join(_TMP, "ties"), "tiny-ties", log=None)
    F.build(os.path.join(_TMP, "noprefix"), "tiny", seed=5, prefix=False, log=None)
    F.build(os.path.join(_TMP, "variant"), "tiny-variant", log=None)
    F.build(os.path.join(_TMP, "vendor"), "vendor-f32", log=None)


def tearDownModule():
    shutil.rmtree(_TMP, ignore_errors=True)


def fx(name):
    return os.path.join(_TMP, name)


def rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def toy_cfg(**kw):
    base = dict(kda_heads=2, kda_dim=4, conv=4, gate_lb=-5.0, eps=1e-5, mla_heads=3, nope=5,
                extra=2, v_dim=4, q_lora=6, kv_lora=5, top_k=3, renorm=True, scaling=1.0,
                beta1=4.0, beta2=25.0, latent_norm=True)
    base.update(kw)
    return types.SimpleNamespace(**base)


class Mxfp4Test(unittest.TestCase):
    def test_all_codes_both_nibbles_against_bit_decoding(self):
        # e2m1 from its bits: sign(1) exponent(2) mantissa(1), bias 1, exponent 0 subnormal.
        def e2m1(code):
            sign = -1.0 if code & 8 else 1.0
            e, m = (code >> 1) & 3, code & 1
            mag = 0.5 * m if e == 0 else 2.0 ** (e - 1) * (1 + m / 2)
            return sign * mag

        codes = np.arange(16, dtype=np.uint8)
        lo = np.tile(codes, 4)                     # 64 columns of low nibbles
        hi = np.roll(lo, 5)
        packed = (lo | (hi << 4)).astype(np.uint8).reshape(2, 32)
        scale = np.array([[120, 127], [127 + 3, 1]], dtype=np.uint8)
        w = R.mxfp4_dequant(packed, scale)
        for r in range(2):
            for col in range(64):
                byte = packed[r, col // 2]
                code = byte & 15 if col % 2 == 0 else byte >> 4
                want = e2m1(int(code)) * 2.0 ** (int(scale[r, col // 32]) - 127)
                self.assertEqual(w[r, col], want, (r, col))
        self.assertTrue(np.signbit(w[0, 16]) and w[0, 16] == 0)    # byte 8 low nibble: code 8 = -0
        self.assertEqual(sorted(set(np.abs(R.E2M1))), [0, 0.5, 1, 1.5, 2, 3, 4, 6])

    def test_scale_255_is_nan_and_shape_mismatch_refused(self):
        w = R.mxfp4_dequant(np.full((1, 16), 0x22, np.uint8), np.array([[255]], np.uint8))
        self.assertTrue(np.all(np.isnan(w)))
        with self.assertRaises(R.RefError):
            R.mxfp4_dequant(np.zeros((2, 16), np.uint8), np.zeros((2, 2), np.uint8))


class QuantTest(unittest.TestCase):
    def test_int8_and_int4_against_elementwise_loops(self):
        rng = np.random.default_rng(8)
        w = (rng.standard_normal((5, 128)) * 0.05).astype(np.float32)
        w[2] = 0.0                                                   # all-zero row: floor 1e-20
        w[3, 7] = 0.5 * (w[3].max() / 127)                           # near a rounding edge
        q8, s8 = R.quant_int8_rows(w)
        q4, s4 = R.quant_int4_g64(w)
        for r in range(5):
            m = max(abs(float(v)) for v in w[r])
            s = np.float32(max(np.float32(m) / np.float32(127), np.float32(1e-20)))
            self.assertEqual(s8[r], s)
            inv = np.float32(1) / s
            for c in range(128):
                want = int(np.clip(np.rint(np.float32(w[r, c]) * inv), -127, 127))
                self.assertEqual(int(q8[r, c]), want)
            for g in range(2):
                grp = w[r, 64 * g:64 * g + 64]
                sg = np.float32(max(np.float32(np.abs(grp).max()) / np.float32(7),
                                    np.float32(1e-20)))
                self.assertEqual(s4[r, g], sg)
                for c in range(64):
                    want = int(np.clip(np.rint(grp[c] * (np.float32(1) / sg)), -8, 7))
                    self.assertEqual(int(q4[r, 64 * g + c]), want)
        self.assertEqual(int(np.abs(q8[0]).max()), 127)
        self.assertTrue(q4.min() >= -8 and q4.max() <= 7)
        self.assertTrue(np.all(R.quantize_dequant(w.astype(np.float64), 8)[2] == 0))
        # int4 needs 64-column groups; otherwise int8 (spec §4.3)
        narrow = w[:, :96].astype(np.float64)
        np.testing.assert_array_equal(R.quantize_dequant(narrow, 4), R.quantize_dequant(narrow, 8))
        err = np.abs(R.quantize_dequant(w.astype(np.float64), 8) - w)
        self.assertTrue(np.all(err <= s8[:, None] / 2 * (1 + 1e-6)))
        with self.assertRaises(R.RefError):
            R.quantize_dequant(w, 6)

    def test_quantized_reference_is_consistent_and_differs(self):
        ids = np.random.default_rng(9).integers(0, 512, 32)
        exact = R.Model(fx("tiny"))
        le, _, _ = exact.forward(exact.embed(ids))
        for bits in (8, 4):
            a = R.Model(fx("tiny"), bits=bits, mla_bits=8, head_bits=8)
            b = R.Model(fx("tiny"), bits=bits, mla_bits=8, head_bits=8, dtype=np.float32)
            la, _, _ = a.forward(a.embed(ids))
            lb, _, _ = b.forward(b.embed(ids))
            per_pos = np.linalg.norm(lb - la, axis=1) / np.linalg.norm(la, axis=1)
            self.assertLess(per_pos.max(), 1e-5)                      # an f32 int engine can match
            self.assertGreater(rel(la, le), 1e-3)                     # and quantization shows
        # the router, f_a/f_b, b_proj and norms are never quantized
        q = R.Model(fx("tiny"), bits=4, mla_bits=4, head_bits=4)
        for key in ("router", "bias", "lat_norm"):
            np.testing.assert_array_equal(q.layer(2)["ffn"][key], exact.layer(2)["ffn"][key])
        for key in ("f_a", "f_b", "b", "q_conv"):
            np.testing.assert_array_equal(q.layer(1)["attn"][key], exact.layer(1)["attn"][key])
        self.assertFalse(np.array_equal(q.layer(1)["attn"]["q"], exact.layer(1)["attn"]["q"]))


class KdaTest(unittest.TestCase):
    def weights(self, rng, cfg, D):
        H, d, K = cfg.kda_heads, cfg.kda_dim, cfg.conv
        C = H * d
        n = rng.standard_normal
        return {"q": n((C, D)), "k": n((C, D)), "v": n((C, D)), "g": n((C, D)),
                "o": n((D, C)), "q_conv": n((C, K)), "k_conv": n((C, K)), "v_conv": n((C, K)),
                "f_a": n((3, D)), "f_b": n((C, 3)), "b": n((H, D)),
                "A_log": np.concatenate([np.log(rng.uniform(1, 16, H)), np.zeros(3)]),
                "dt_bias": n(C), "o_norm": 1 + 0.1 * n(d)}

    def test_recurrence_matches_closed_form(self):
        rng = np.random.default_rng(3)
        cfg, D, T = toy_cfg(), 6, 9
        w = self.weights(rng, cfg, D)
        x = rng.standard_normal((T, D))
        a, st = R.kda_layer(x, w, cfg)

        H, d, K = cfg.kda_heads, cfg.kda_dim, cfg.conv
        sig = lambda z: 1 / (1 + np.exp(-z))  # noqa: E731

        def conv(raw, taps):                      # y_t = sum_j taps[j] * raw[t-K+1+j]
            out = np.zeros_like(raw)
            for t in range(T):
                for j in range(K):
                    src = t - (K - 1) + j
                    if src >= 0:
                        out[t] += taps[:, j] * raw[src]
            return out * sig(out)

        q = conv(x @ w["q"].T, w["q_conv"])
        k = conv(x @ w["k"].T, w["k_conv"])
        v = conv(x @ w["v"].T, w["v_conv"])
        graw = x @ w["f_a"].T @ w["f_b"].T
        beta = sig(x @ w["b"].T)
        gate = sig(x @ w["g"].T)
        outs = np.zeros((T, H * d))
        S = [np.zeros((d, d)) for _ in range(H)]
        for t in range(T):
            for h in range(H):
                sl = slice(h * d, (h + 1) * d)
                qh = q[t, sl] / np.sqrt(q[t, sl] @ q[t, sl] + 1e-6) / np.sqrt(d)
                kh = k[t, sl] / np.sqrt(k[t, sl] @ k[t, sl] + 1e-6)
                alpha = np.exp(-5 * sig(np.exp(w["A_log"][h]) * (graw[t, sl] + w["dt_bias"][sl])))
                b = beta[t, h]
                # closed form: S_t = (I - b k k^T) Diag(alpha) S_{t-1} + b k v^T
                S[h] = (np.eye(d) - b * np.outer(kh, kh)) @ np.diag(alpha) @ S[h] \
                    + b * np.outer(kh, v[t, sl])
                o = S[h].T @ qh
                o = o / np.sqrt(np.mean(o * o) + cfg.eps) * w["o_norm"]
                outs[t, sl] = o * gate[t, sl]
        want = outs @ w["o"].T
        self.assertLess(rel(a, want), 1e-12)
        for h in range(H):
            self.assertLess(rel(st["S"][h], S[h]), 1e-12)

    def test_state_carry_equals_one_pass(self):
        rng = np.random.default_rng(4)
        cfg, D = toy_cfg(), 6
        w = self.weights(rng, cfg, D)
        x = rng.standard_normal((11, D))
        full, _ = R.kda_layer(x, w, cfg)
        a1, st = R.kda_layer(x[:2], w, cfg)
        a2, st = R.kda_layer(x[2:3], w, cfg, st)
        a3, _ = R.kda_layer(x[3:], w, cfg, st)
        self.assertLess(rel(np.concatenate([a1, a2, a3]), full), 1e-13)


class MlaTest(unittest.TestCase):
    def test_absorbed_equals_unabsorbed_and_cache_split(self):
        rng = np.random.default_rng(5)
        cfg, D, T = toy_cfg(), 7, 8
        H, n, xd, v = cfg.mla_heads, cfg.nope, cfg.extra, cfg.v_dim
        nr = rng.standard_normal
        w = {"q_a": nr((cfg.q_lora, D)), "q_a_norm": 1 + 0.1 * nr(cfg.q_lora),
             "q_b": nr((H * (n + xd), cfg.q_lora)), "kv_a": nr((cfg.kv_lora + xd, D)),
             "kv_a_norm": 1 + 0.1 * nr(cfg.kv_lora), "kv_b": nr((H * (n + v), cfg.kv_lora)),
             "g": nr((H * v, D)), "o": nr((D, H * v))}
        x = rng.standard_normal((T, D))
        a, cache = R.mla_layer(x, w, cfg)
        b, _ = R.mla_layer_absorbed(x, w, cfg)
        self.assertLess(rel(b, a), 1e-12)
        self.assertEqual(cache["c"].shape, (T, cfg.kv_lora))
        self.assertEqual(cache["kx"].shape, (T, xd))
        a1, c1 = R.mla_layer(x[:5], w, cfg)
        a2, _ = R.mla_layer_absorbed(x[5:], w, cfg, mla_eps=1e-6, cache=c1)
        self.assertLess(rel(np.concatenate([a1, a2]), a), 1e-12)
        # position 0 sees only itself: softmax weight 1 on its own value
        kvb = w["kv_b"].reshape(H, n + v, cfg.kv_lora)
        c0 = cache["c"][0]
        ctx = np.stack([kvb[h, n:] @ c0 for h in range(H)])
        gate = 1 / (1 + np.exp(-(w["g"] @ x[0])))
        self.assertLess(rel(a[0], (ctx.reshape(-1) * gate) @ w["o"].T), 1e-12)
        # the latent-norm epsilon is an input: 1e-6 and 1e-5 give different outputs
        e5, _ = R.mla_layer(x * 1e-3, w, cfg, mla_eps=1e-5)
        e6, _ = R.mla_layer(x * 1e-3, w, cfg, mla_eps=1e-6)
        self.assertGreater(rel(e5, e6), 1e-3)


class RouterTest(unittest.TestCase):
    def test_ties_go_to_lowest_index_and_bias_only_selects(self):
        cfg = toy_cfg(top_k=2)
        r = np.array([[1.0, 0.0], [2.0, 0.0], [1.0, 0.0], [2.0, 0.0], [0.0, 0.0]])
        w = {"router": r, "bias": np.zeros(5)}
        ids, wt, s = R.route(np.array([[1.0, 0.0]]), w, cfg)
        self.assertEqual(ids.tolist(), [[1, 3]])                  # 1 and 3 tie, both in
        w["bias"] = np.array([0.0, 0.0, 0.0, -0.5, 0.0])
        ids, wt, s = R.route(np.array([[1.0, 0.0]]), w, cfg)
        self.assertEqual(ids.tolist(), [[1, 0]])                  # 0 and 2 tie: 0 wins
        self.assertAlmostEqual(wt.sum(), 1.0)
        sig = 1 / (1 + np.exp(-np.array([2.0, 1.0])))
        np.testing.assert_allclose(wt[0], sig / sig.sum(), rtol=1e-15)   # bias not in weights
        w["bias"] = np.array([0.0, 0.0, 0.0, 0.0, 0.9])
        ids, _, _ = R.route(np.array([[1.0, 0.0]]), w, cfg)
        self.assertEqual(ids.tolist(), [[4, 1]])                  # bias moves expert 4 in
        cfg.scaling = 2.0
        _, wt, _ = R.route(np.array([[1.0, 0.0]]), w, cfg)
        self.assertAlmostEqual(wt.sum(), 2.0)

    def test_latent_moe_against_dense_sum(self):
        rng = np.random.default_rng(6)
        cfg, D, lat, inter, E = toy_cfg(top_k=2), 8, 4, 6, 5
        n = rng.standard_normal
        w = {"router": n((E, D)), "bias": 0.1 * n(E), "down_lat": n((lat, D)),
             "lat_norm": 1 + 0.1 * n(lat), "up_lat": n((D, lat)), "sh_gate": n((12, D)),
             "sh_up": n((12, D)), "sh_down": n((D, 12))}
        experts = [(n((inter, lat)), n((lat, inter)), n((inter, lat))) for _ in range(E)]
        x = n((5, D))
        got = R.latent_moe(x, w, cfg, lambda e: experts[e])
        for t in range(5):
            s = 1 / (1 + np.exp(-(w["router"] @ x[t])))
            pick = sorted(range(E), key=lambda e: (-(s[e] + w["bias"][e]), e))[:2]
            z = w["down_lat"] @ x[t]
            u = sum(s[e] / sum(s[p] for p in pick) *
                    (experts[e][1] @ R.situ(experts[e][0] @ z, experts[e][2] @ z)) for e in pick)
            u = u / np.sqrt(np.mean(u * u) + cfg.eps) * w["lat_norm"]
            sh = w["sh_down"] @ R.situ(w["sh_gate"] @ x[t], w["sh_up"] @ x[t])
            self.assertLess(rel(got[t], w["up_lat"] @ u + sh), 1e-12)

    def test_situ_formula(self):
        g, u = np.array([-3.0, 0.5, 9.0]), np.array([40.0, -2.0, 0.1])
        want = 4 * np.tanh(g / 4) / (1 + np.exp(-g)) * 25 * np.tanh(u / 25)
        np.testing.assert_allclose(R.situ(g, u), want, rtol=1e-14)


class AttnResTest(unittest.TestCase):
    def test_mix_formula(self):
        rng = np.random.default_rng(7)
        v = rng.standard_normal((3, 2, 5))
        nw, pw = rng.standard_normal(5), rng.standard_normal((1, 5))
        got = R.attnres_mix(v, nw, pw, 1e-5)
        for t in range(2):
            sc = [(v[j, t] / np.sqrt(np.mean(v[j, t] ** 2) + 1e-5) * nw) @ pw[0] for j in range(3)]
            p = np.exp(sc) / np.sum(np.exp(sc))
            self.assertLess(rel(got[t], sum(p[j] * v[j, t] for j in range(3))), 1e-14)

    def test_snapshot_bookkeeping_with_partial_block(self):
        # Sublayer outputs are distinct powers of two, so every candidate is identifiable as a
        # set of sublayers; block 3 over 7 layers leaves a partial last block (layer 6).
        block, N = 3, 7
        calls = []

        def attn(i, h):
            return np.full((1, 1), 2.0 ** (2 * i + 1))

        def ffn(i, m):
            return np.full((1, 1), 2.0 ** (2 * i + 2))

        def mix(i, site, cands):
            calls.append((i, site, [float(c[0, 0]) for c in cands]))
            return cands[-1] * 0 + 1000.0 * (len(calls))  # the value does not feed the sums

        out_val = 1.0
        _, trace = R.attnres_stack(np.full((1, 1), out_val), N, block, attn, ffn, mix)

        def s(*subs):
            return float(sum(2.0 ** k for k in subs))

        # snapshots: x0, then the sum of layers 0-2 (exponents 1..6), then layers 3-5 (7..12)
        snap = [1.0, s(1, 2, 3, 4, 5, 6), s(7, 8, 9, 10, 11, 12)]
        want = []
        for i in range(N):
            k = i // block
            first = 2 * (k * block) + 1
            before = s(*range(first, 2 * i + 1)) if i % block else None
            if i > 0:
                prefix_in = (snap[k] if i % block == 0 else before)
                want.append((i, "attn_res", snap[:k + (0 if i % block == 0 else 1)] + [prefix_in]))
            want.append((i, "mlp_res", snap[:k + 1] + [s(*range(first, 2 * i + 2))]))
        want.append((None, "out", snap + [s(13, 14)]))
        self.assertEqual(calls, want)
        self.assertEqual(trace[0, :, 0].tolist(),
                         [s(*range(2 * (i // block * block) + 1, 2 * i + 3)) for i in range(N)])


class FixtureTest(unittest.TestCase):
    def test_config_layout_and_labels(self):
        for name, L, mla, block in (("tiny", 13, [3, 7, 11, 12], 5), ("ties", 8, [3, 7], 3)):
            with open(os.path.join(fx(name), "config.json")) as f:
                root = json.load(f)
            t = root["text_config"]
            self.assertEqual(root["coli_fixture"], "random weights, not a real model")
            self.assertEqual(root["architectures"], ["KimiK3ForConditionalGeneration"])
            la = t["linear_attn_config"]
            self.assertEqual([x - 1 for x in la["full_attn_layers"]], mla)
            self.assertEqual(sorted(la["kda_layers"] + la["full_attn_layers"]),
                             list(range(1, L + 1)))
            self.assertEqual(t["num_hidden_layers"], L)
            self.assertEqual(t["attn_res_block_size"], block)
            self.assertNotEqual(L % block, 0)                       # partial last block
            spec_keys = (  # spec §1.2, all of them, plus the ignorable round-trip keys
                "model_type architectures hidden_size num_hidden_layers vocab_size "
                "intermediate_size first_k_dense_replace moe_layer_freq num_attention_heads "
                "num_key_value_heads q_lora_rank kv_lora_rank qk_nope_head_dim qk_rope_head_dim "
                "v_head_dim mla_use_nope mla_use_output_gate linear_attn_config num_experts "
                "num_experts_per_token num_shared_experts moe_intermediate_size "
                "routed_expert_hidden_size latent_moe_use_norm moe_router_activation_func "
                "moe_renormalize routed_scaling_factor num_expert_group topk_group topk_method "
                "use_grouped_topk hidden_act activation_situ_beta activation_situ_linear_beta "
                "attn_res_block_size rms_norm_eps max_position_embeddings "
                "num_nextn_predict_layers tie_word_embeddings quantization_config head_dim "
                "rope_theta").split()
            for key in spec_keys:
                self.assertIn(key, t)
            for key in ("num_heads", "head_dim", "short_conv_kernel_size", "gate_lower_bound",
                        "use_full_rank_gate", "kda_layers", "full_attn_layers"):
                self.assertIn(key, la)
            for key in ("model_type", "auto_map", "bos_token_id", "eos_token_id", "pad_token_id",
                        "media_placeholder_token_id", "image_placeholder", "ignore_index",
                        "dtype", "tie_word_embeddings", "vision_config"):
                self.assertIn(key, root)
            self.assertEqual((t["model_type"], t["hidden_act"], t["topk_method"]),
                             ("kimi_linear", "situ", "noaux_tc"))
            self.assertEqual(t["quantization_config"]["config_groups"]["group_0"]["weights"]
                             ["group_size"], 32)
            with open(os.path.join(fx(name), "README.txt")) as f:
                self.assertIn("RANDOM WEIGHTS", f.read())

    def _headers(self, path):
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        return n, header

    def test_every_shard_reread_contiguous_shuffled_experts(self):
        d = fx("tiny")
        with open(os.path.join(d, "model.safetensors.index.json")) as f:
            index = json.load(f)
        shards = sorted(set(index["weight_map"].values()))
        self.assertEqual(shards, [f"model-{k:05d}-of-000016.safetensors" for k in range(1, 17)])
        total = 0
        cfg = R.Config(os.path.join(d, "config.json"))
        for k, shard in enumerate(shards):
            path = os.path.join(d, shard)
            n, header = self._headers(path)
            self.assertEqual((8 + n) % 8, 0)
            spans = sorted(v["data_offsets"] for key, v in header.items() if key != "__metadata__")
            pos = 0
            for b, e in spans:                                   # no holes, no overlap
                self.assertEqual(b, pos)
                pos = e
            self.assertEqual(8 + n + pos, os.path.getsize(path))
            total += pos
            names = [key for key in header if key != "__metadata__"]
            for name in names:
                self.assertEqual(index["weight_map"][name], shard)
            if k < 13:
                self.assertTrue(all(x.startswith(f"language_model.model.layers.{k}.")
                                    for x in names))
            if 1 <= k < 13:
                experts = {}
                for e in range(cfg.experts):
                    base = f"language_model.model.layers.{k}.block_sparse_moe.experts.{e}"
                    parts = [header[f"{base}.{m}.weight_{s}"]["data_offsets"]
                             for m in ("w1", "w2", "w3") for s in ("packed", "scale")]
                    for (b0, e0), (b1, e1) in zip(parts, parts[1:]):
                        self.assertEqual(e0, b1, f"expert {e} of layer {k} not contiguous")
                    self.assertEqual(parts[-1][1] - parts[0][0], 9792)
                    experts[e] = parts[0][0]
                order = sorted(experts, key=experts.get)
                self.assertNotEqual(order, sorted(order), f"layer {k}: experts in id order")
            if k >= 14:
                self.assertTrue(all(x.startswith(("vision_tower.", "mm_projector.")) for x in names))
        self.assertEqual(index["metadata"]["total_size"], total)

    def test_reference_check_reads_everything_never_vision(self):
        for name in ("tiny", "ties", "noprefix"):
            m = R.Model(fx(name))
            m.check()
            opened = set(m.snap._shards)
            self.assertFalse(any(s.endswith(("00015-of-000016.safetensors",
                                             "00016-of-000016.safetensors",
                                             "00010-of-000011.safetensors",
                                             "00011-of-000011.safetensors")) for s in opened))
        self.assertEqual(R.Model(fx("noprefix")).snap.prefix, "")
        self.assertEqual(R.Model(fx("tiny")).snap.prefix, "language_model.")

    def test_f32_tensors_are_bf16_exact_and_a_log_padding(self):
        m = R.Model(fx("tiny"))
        for name, (dtype, shape, off, nb) in m.snap._shard(
                "model-00001-of-000016.safetensors").tensors.items():
            if dtype == "F32":
                bits = m.snap._shard("model-00001-of-000016.safetensors").raw(name).view(np.uint32)
                self.assertTrue(np.all(bits & 0xFFFF == 0), name)
        a = m.layer(0)["attn"]["A_log"]
        self.assertEqual(len(a), 32)
        self.assertTrue(np.all(a[4:] == 0) and np.all(a[:4] != 0))
        self.assertEqual(len(R.Model(fx("ties")).layer(0)["attn"]["A_log"]), 2)

    def test_vendor_f32_preset_is_full_precision_with_plain_experts(self):
        # Spec §9.8: every tensor F32 with full mantissas, experts as plain w{1,2,3}.weight of
        # the logical shapes, no quantization_config, the oracle's dimensions.
        d = fx("vendor")
        with open(os.path.join(d, "config.json")) as f:
            t = json.load(f)["text_config"]
        self.assertNotIn("quantization_config", t)
        want = dict(hidden_size=64, intermediate_size=64, num_hidden_layers=6, num_attention_heads=2,
                    q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=32, qk_rope_head_dim=16,
                    v_head_dim=32, num_experts=8, num_experts_per_token=2, num_shared_experts=1,
                    moe_intermediate_size=32, routed_expert_hidden_size=32,
                    routed_scaling_factor=2.0, first_k_dense_replace=1, attn_res_block_size=2,
                    rms_norm_eps=1e-3)
        for k, v in want.items():
            self.assertEqual(t[k], v, k)
        la = t["linear_attn_config"]
        self.assertEqual((la["num_heads"], la["head_dim"], la["short_conv_kernel_size"]),
                         (2, 32, 4))
        self.assertEqual(la["full_attn_layers"], [3, 6])
        m = R.Model(d)
        m.check()
        full_mantissa = 0
        for fname in sorted(set(m.snap.weight_map.values()))[:7]:   # the text shards
            shard = m.snap._shard(fname)
            for name, (dtype, shape, off, nb) in shard.tensors.items():
                self.assertEqual(dtype, "F32", name)
                self.assertNotIn("weight_packed", name)
                full_mantissa += int(np.any(shard.raw(name).view(np.uint32) & 0xFFFF))
        self.assertGreater(full_mantissa, 100)
        lat, inter = t["routed_expert_hidden_size"], t["moe_intermediate_size"]
        E = "model.layers.2.block_sparse_moe.experts.5"
        w1, w2, w3 = m.expert(2, 5)
        for got, (mat, shape) in zip((w1, w2, w3), (("w1", [inter, lat]), ("w2", [lat, inter]),
                                                    ("w3", [inter, lat]))):
            stored = m.snap.raw(f"{E}.{mat}.weight", "F32", shape)
            np.testing.assert_array_equal(got, stored.astype(np.float64))
        # Layer 4 is matrix-major (an expert is not one range), layer 2 expert-contiguous.
        def spans(i, e):
            infos = [m.snap.info(f"model.layers.{i}.block_sparse_moe.experts.{e}.{w}.weight")
                     for w in ("w1", "w2", "w3")]
            return all(a[2] + a[3] == b[2] for a, b in zip(infos, infos[1:]))
        self.assertTrue(all(spans(2, e) for e in range(8)))
        self.assertFalse(any(spans(4, e) for e in range(8)))

    def test_expert_mixing_plain_and_packed_is_refused(self):
        d = os.path.join(_TMP, "vendor_mixed")
        shutil.copytree(fx("vendor"), d)
        old = "language_model.model.layers.3.block_sparse_moe.experts.6.w3.weight"
        new = old + "_packed"
        p = os.path.join(d, "model.safetensors.index.json")
        with open(p) as f:
            j = json.load(f)
        shard = j["weight_map"].pop(old)
        j["weight_map"][new] = shard
        with open(p, "w") as f:
            json.dump(j, f)
        sp = os.path.join(d, shard)
        with open(sp, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            h = json.loads(f.read(n))
            rest = f.read()
        h[new] = h.pop(old)
        hj = json.dumps(h).encode()
        hj += b" " * ((8 - (8 + len(hj)) % 8) % 8)
        with open(sp, "wb") as f:
            f.write(struct.pack("<Q", len(hj)) + hj + rest)
        with self.assertRaises(R.RefError) as ctx:
            R.Model(d).expert(3, 6)
        self.assertIn("experts.6", str(ctx.exception))

    def test_tokenizer_files(self):
        d = fx("tiny")
        vocab = []
        with open(os.path.join(d, "tiktoken.model")) as f:
            for rank, line in enumerate(f):
                b64, r = line.split()
                self.assertEqual(int(r), rank)
                vocab.append(base64.b64decode(b64))
        self.assertEqual(len(vocab), 512)
        self.assertEqual(len(set(vocab)), 512)
        self.assertEqual(sorted(v for v in vocab if len(v) == 1), [bytes([b]) for b in range(256)])
        self.assertNotEqual(vocab[0], b"\x00")                   # rank != byte value
        with open(os.path.join(d, "tokenizer_config.json")) as f:
            tc = json.load(f)["added_tokens_decoder"]
        names = {int(k): v["content"] for k, v in tc.items()}
        self.assertEqual(len(names), 256)
        want = {512: "[BOS]", 513: "[EOS]", 514: "<|end_of_msg|>", 515: "<|open|>",
                516: "<|close|>", 517: "<|sep|>", 766: "[UNK]", 767: "[PAD]",
                600: "<|reserved_token_600|>"}
        for k, v in want.items():
            self.assertEqual(names[k], v)
        with open(os.path.join(d, "config.json")) as f:
            root = json.load(f)
        self.assertEqual(names[root["bos_token_id"]], "[BOS]")
        self.assertEqual(names[root["eos_token_id"]], "<|end_of_msg|>")
        self.assertEqual(root["text_config"]["vocab_size"], 768)
        # rank-BPE (lowest-rank adjacent merge) turns real text into multi-byte tokens
        ranks = {v: i for i, v in enumerate(vocab)}

        def encode(piece):
            parts = [bytes([b]) for b in piece]
            while True:
                best = min(((ranks.get(parts[i] + parts[i + 1], 1 << 30), i)
                            for i in range(len(parts) - 1)), default=(1 << 30, 0))
                if best[0] == 1 << 30:
                    return [ranks[p] for p in parts]
                i = best[1]
                parts[i:i + 2] = [parts[i] + parts[i + 1]]

        for word in (" the", " model", "的", "token", " and"):
            ids = encode(word.encode())
            self.assertEqual(b"".join(vocab[i] for i in ids), word.encode())
            self.assertLess(len(ids), len(word.encode()), word)

    def test_real_expert_size_and_packing(self):
        d = os.path.join(_TMP, "real")
        F.build(d, "real-experts", moe_layers=1, experts=2, top_k=1, log=None)
        cfg = R.Config(os.path.join(d, "config.json"))
        self.assertEqual((cfg.latent, cfg.moe_inter, cfg.layers), (3584, 3072, 2))
        n, header = self._headers(os.path.join(d, "model-00002-of-000005.safetensors"))
        for e in range(2):
            base = f"language_model.model.layers.1.block_sparse_moe.experts.{e}"
            first = header[f"{base}.w1.weight_packed"]["data_offsets"][0]
            last = header[f"{base}.w3.weight_scale"]["data_offsets"][1]
            self.assertEqual(last - first, 17547264)
            self.assertEqual(header[f"{base}.w2.weight_packed"]["shape"], [3584, 1536])
            self.assertEqual(header[f"{base}.w1.weight_scale"]["shape"], [3072, 112])
        m = R.Model(d)
        w1, w2, w3 = m.expert(1, 1)
        self.assertEqual(w1.shape, (3072, 3584))
        self.assertTrue(np.all(np.isfinite(w2)) and np.all(np.abs(w1) <= 6 * 2.0 ** -5))
        shutil.rmtree(d)

    def test_lazy_block_writer_makes_a_valid_snapshot(self):
        # real-widths writes its big matrices block by block; force that path on tiny widths.
        old = F.LAZY_ELEMENTS
        F.LAZY_ELEMENTS = 2048
        try:
            d1, d2 = os.path.join(_TMP, "lazy1"), os.path.join(_TMP, "lazy2")
            F.build(d1, "tiny", log=None)
            F.build(d2, "tiny", log=None)
        finally:
            F.LAZY_ELEMENTS = old
        m = R.Model(d1)
        m.check()
        q = m.layer(1)["attn"]["q"]
        self.assertAlmostEqual(float(np.std(q)) * 8, 1.0, delta=0.1)   # gain 1 / sqrt(64)
        logits, _, _ = m.forward(m.embed([1, 2, 3]))
        self.assertTrue(np.all(np.isfinite(logits)))
        for f in ("model-00002-of-000016.safetensors", "model-00014-of-000016.safetensors"):
            with open(os.path.join(d1, f), "rb") as a, open(os.path.join(d2, f), "rb") as b:
                self.assertEqual(a.read(), b.read())
        shutil.rmtree(d1)
        shutil.rmtree(d2)

    def test_deterministic_for_a_seed(self):
        d = os.path.join(_TMP, "again")
        F.build(d, "tiny", log=None)
        for f in sorted(os.listdir(d)):
            with open(os.path.join(d, f), "rb") as a, open(os.path.join(fx("tiny"), f), "rb") as b:
                self.assertEqual(a.read(), b.read(), f)
        shutil.rmtree(d)


class ModelTest(unittest.TestCase):
    def test_incremental_decode_equals_full_pass(self):
        m = R.Model(fx("tiny"))
        ids = list(range(100, 140, 3))
        full, trace, _ = m.forward(m.embed(ids))
        logits, state = [], None
        for i in range(0, len(ids), 4):                          # chunks of 4, then continue
            lg, _, state = m.forward(m.embed(ids[i:i + 4]), None, state)
            logits.append(lg)
        self.assertLess(rel(np.concatenate(logits), full), 1e-12)
        self.assertEqual(trace.shape, (len(ids), 13, 64))

    def test_trace_is_the_in_block_sum(self):
        # h after layer i = running in-block sum: restarts from a_i + f_i at a block start.
        m = R.Model(fx("tiny"))
        ids = [3, 1, 4, 1, 5, 9, 2, 6]
        subs = np.zeros((len(ids), 13, 2, 64))
        _, trace, _ = m.forward(m.embed(ids), sublayers=subs)
        for i in range(13):
            start = np.zeros_like(trace[:, 0]) if i % 5 == 0 else trace[:, i - 1]
            np.testing.assert_allclose(trace[:, i], start + subs[:, i, 0] + subs[:, i, 1],
                                       rtol=0, atol=1e-14)

    def test_fixture_is_well_conditioned_in_f32(self):
        # An all-f32 evaluation must stay far inside the engine's 1e-5 gate at every position.
        for name in ("tiny", "ties", "variant", "vendor"):
            m64, m32 = R.Model(fx(name)), R.Model(fx(name), dtype=np.float32)
            ids = np.random.default_rng(11).integers(0, 512, 96)
            a, ta, _ = m64.forward(m64.embed(ids))
            b, tb, _ = m32.forward(m32.embed(ids))
            self.assertEqual(b.dtype, np.float32)
            per_pos = np.linalg.norm(b - a, axis=1) / np.linalg.norm(a, axis=1)
            self.assertLess(per_pos.max(), 5e-6, name)
            per_layer = np.linalg.norm(tb - ta, axis=2) / np.linalg.norm(ta, axis=2)
            self.assertLess(per_layer.max(), 1e-5, name)

    def test_mla_epsilon_is_visible(self):
        ids = list(range(200, 240))
        a = R.Model(fx("tiny"), 1e-6)
        b = R.Model(fx("tiny"), 1e-5)
        la, _, _ = a.forward(a.embed(ids))
        lb, _, _ = b.forward(b.embed(ids))
        per_pos = np.linalg.norm(la - lb, axis=1) / np.linalg.norm(la, axis=1)
        self.assertGreater(per_pos.min(), 1e-4)

    def test_ties_preset_exercises_ties_and_bias(self):
        m = R.Model(fx("ties"))
        seen = {"rows": 0, "tie_at_boundary": 0, "bias_changed": 0}
        orig = R.route

        def spy(x, w, cfg):
            ids, wt, s = orig(x, w, cfg)
            srt = np.sort(s + w["bias"], axis=1)[:, ::-1]
            seen["rows"] += len(x)
            seen["tie_at_boundary"] += int(np.sum(srt[:, cfg.top_k - 1] == srt[:, cfg.top_k]))
            plain = np.argsort(-s, axis=1, kind="stable")[:, :cfg.top_k]
            seen["bias_changed"] += sum(set(p) != set(q) for p, q in zip(ids, plain))
            for row, sel in zip(s + w["bias"], ids):            # lowest index on exact ties
                for grp in F.TIE_GROUPS:
                    inside = [e for e in grp if e in sel]
                    if 0 < len(inside) < len(grp):
                        self.assertEqual(inside, list(grp[:len(inside)]))
            return ids, wt, s

        R.route = spy
        try:
            m.forward(m.embed(np.random.default_rng(2).integers(0, 512, 64)))
        finally:
            R.route = orig
        self.assertGreater(seen["tie_at_boundary"], seen["rows"] // 10)
        self.assertGreater(seen["bias_changed"], seen["rows"] // 10)

    def test_bad_snapshots_are_named(self):
        src = fx("ties")
        cases = []

        def variant(tag, edit):
            d = os.path.join(_TMP, "bad_" + tag)
            shutil.copytree(src, d)
            edit(d)
            cases.append((tag, d))

        def edit_index(d, fn):
            p = os.path.join(d, "model.safetensors.index.json")
            with open(p) as f:
                j = json.load(f)
            fn(j["weight_map"])
            with open(p, "w") as f:
                json.dump(j, f)

        def rewrite_header(d, shard, fn):
            p = os.path.join(d, shard)
            with open(p, "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                h = json.loads(f.read(n))
                rest = f.read()
            fn(h)
            hj = json.dumps(h).encode()
            hj += b" " * ((8 - len(hj) % 8) % 8)
            with open(p, "wb") as f:
                f.write(struct.pack("<Q", len(hj)) + hj + rest)

        name = "language_model.model.layers.1.self_attn.q_proj.weight"
        variant("missing", lambda d: edit_index(d, lambda m: m.pop(name)))
        # I16 (not F16: a BF16 slot takes F32 / F16 too, spec §9.8's full-precision snapshot).
        variant("dtype", lambda d: rewrite_header(
            d, "model-00002-of-000011.safetensors",
            lambda h: h[name].update(dtype="I16")))
        variant("shape", lambda d: rewrite_header(
            d, "model-00002-of-000011.safetensors",
            lambda h: h[name].update(shape=[16, 128])))
        variant("truncated", lambda d: os.truncate(
            os.path.join(d, "model-00002-of-000011.safetensors"), 5000))
        want = {"missing": name, "dtype": name, "shape": name, "truncated": "truncated"}
        for tag, d in cases:
            with self.assertRaises(R.RefError) as ctx:
                R.Model(d).check()
            self.assertIn(want[tag], str(ctx.exception), tag)

    def test_cli_run_and_layer(self):
        d = fx("tiny")
        out = os.path.join(_TMP, "cli")
        os.makedirs(out, exist_ok=True)
        ref = os.path.join(TOOLS, "k3_ref.py")
        ids = [5, 77, 300, 512, 9]
        r = subprocess.run([sys.executable, ref, "run", "--model", d, "--ids",
                            ",".join(map(str, ids)), "--layers", "6",
                            "--out-logits", f"{out}/l.f32", "--out-trace", f"{out}/t.f32",
                            "--greedy", "3"], capture_output=True, text=True, check=True)
        gen = json.loads(r.stdout)["ids"]
        m = R.Model(d)
        logits, trace, _ = m.forward(m.embed(ids), 6)
        self.assertEqual(len(gen), 3)
        self.assertEqual(gen[0], int(np.argmax(logits[-1])))
        np.testing.assert_array_equal(np.fromfile(f"{out}/l.f32", "<f4").reshape(5, 768),
                                      logits.astype(np.float32))
        np.testing.assert_array_equal(np.fromfile(f"{out}/t.f32", "<f4").reshape(5, 6, 64),
                                      trace.astype(np.float32))
        x = np.random.default_rng(1).standard_normal((4, 64)).astype("<f4")
        x.tofile(f"{out}/x.f32")
        subprocess.run([sys.executable, ref, "layer", "--model", d, "--layer", "3", "--kind",
                        "attn", "--in", f"{out}/x.f32", "--out", f"{out}/y.f32"], check=True)
        want, _ = R.mla_layer(x.astype(np.float64), m.layer(3)["attn"], m.cfg, 1e-6)
        np.testing.assert_array_equal(np.fromfile(f"{out}/y.f32", "<f4").reshape(4, 64),
                                      want.astype(np.float32))
        r = subprocess.run([sys.executable, ref, "layer", "--model", d, "--layer", "4",
                            "--kind", "router", "--in", f"{out}/x.f32"], capture_output=True,
                           text=True, check=True)
        ids_w, w_w, _ = R.route(x.astype(np.float64), m.layer(4)["ffn"], m.cfg)
        self.assertEqual(json.loads(r.stdout)["ids"], ids_w.tolist())
        np.testing.assert_allclose(json.loads(r.stdout)["weights"], w_w, rtol=1e-15)
        z = np.random.default_rng(2).standard_normal((3, 64)).astype("<f4")
        z.tofile(f"{out}/z.f32")
        subprocess.run([sys.executable, ref, "layer", "--model", d, "--layer", "2", "--kind",
                        "expert", "--expert", "9", "--in", f"{out}/z.f32", "--out",
                        f"{out}/e.f32"], check=True)
        w1, w2, w3 = m.expert(2, 9)
        zz = z.astype(np.float64)
        want = R.situ(zz @ w1.T, zz @ w3.T) @ w2.T
        np.testing.assert_array_equal(np.fromfile(f"{out}/e.f32", "<f4").reshape(3, 64),
                                      want.astype(np.float32))
        cands = np.random.default_rng(3).standard_normal((3, 2, 64)).astype("<f4")
        cands.tofile(f"{out}/c.f32")
        subprocess.run([sys.executable, ref, "layer", "--model", d, "--layer", "6", "--kind",
                        "mix_mlp", "--rows", "2", "--in", f"{out}/c.f32", "--out",
                        f"{out}/m.f32"], check=True)
        L6 = m.layer(6)
        want = R.attnres_mix(cands.astype(np.float64), L6["mlp_res_norm"], L6["mlp_res_proj"],
                             m.cfg.eps)
        np.testing.assert_array_equal(np.fromfile(f"{out}/m.f32", "<f4").reshape(2, 64),
                                      want.astype(np.float32))
        r = subprocess.run([sys.executable, ref, "layer", "--model", d, "--layer", "3",
                            "--kind", "kda", "--in", f"{out}/x.f32"], capture_output=True,
                           text=True)
        self.assertEqual(r.returncode, 1)
        self.assertIn("not a kda layer", r.stderr)


if __name__ == "__main__":
    unittest.main()
