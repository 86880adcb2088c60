"""k3_ref.py against a third, independent reading of spec §3 (spec_reading.py, written by the
audit of issue 10), on the three build fixtures; and proof that the agreement means something:
each misreading the audit considered (delta-rule order, AttnRes mixing normalised candidates,
router weights from the biased scores, the MLA latent epsilon) moves the logits by orders of
magnitude more than the tolerance. Run:
  /usr/bin/python3 -m unittest discover -s tools/k3/tests -v
"""

import os
import shutil
import sys
import tempfile
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import k3_ref as R  # noqa: E402
import make_fixture as F  # noqa: E402
import spec_reading as S  # noqa: E402

_TMP = None
# float64 on both sides: only summation order differs.
TOLERANCE = 1e-12


def setUpModule():
    global _TMP
    _TMP = tempfile.mkdtemp(prefix="k3_spec_reading_")
    for name, preset in (("tiny", "tiny"), ("ties", "tiny-ties"), ("variant", "tiny-variant")):
        F.build(os.path.join(_TMP, name), preset, log=None)


def tearDownModule():
    shutil.rmtree(_TMP, ignore_errors=True)


def fx(name):
    return os.path.join(_TMP, name)


def ids_for(name, n, seed):
    vocab = R.Model(fx(name)).cfg.vocab
    return [int(t) for t in np.random.default_rng(seed).integers(0, vocab, n)]


def worst_rel(a, b):
    return float(np.max(np.linalg.norm(a - b, axis=1) / np.linalg.norm(b, axis=1)))


def reference_logits(name, ids, mla_eps=1e-6):
    m = R.Model(fx(name), mla_eps)
    return m.forward(m.embed(ids))[0]


class SpecReadingTest(unittest.TestCase):
    def test_reference_equals_the_third_reading_on_every_fixture(self):
        for name, n in (("tiny", 10), ("ties", 14), ("variant", 14)):
            ids = ids_for(name, n, 3)
            ref = reference_logits(name, ids)
            mine = S.SpecReading(fx(name)).run(ids)
            self.assertLess(worst_rel(mine, ref), TOLERANCE, name)
            np.testing.assert_array_equal(mine.argmax(axis=1), ref.argmax(axis=1))

    def test_mla_epsilon_option_agrees_too(self):
        ids = ids_for("tiny", 8, 4)
        ref = reference_logits("tiny", ids, mla_eps=1e-5)
        self.assertLess(worst_rel(S.SpecReading(fx("tiny"), mla_eps=1e-5).run(ids), ref),
                        TOLERANCE)

    def test_mxfp4_bit_decoding_equals_the_table(self):
        packed = np.arange(256, dtype=np.uint8).reshape(4, 64)
        scale = np.array([[0, 1, 126, 127], [128, 130, 200, 254], [60, 90, 127, 127],
                          [127, 3, 250, 127]], dtype=np.uint8)
        np.testing.assert_array_equal(S.mxfp4(packed, scale), R.mxfp4_dequant(packed, scale))

    def test_variant_fixture_is_what_it_claims(self):
        c = R.Model(fx("variant")).cfg
        self.assertEqual([i + 1 for i in range(c.layers) if c.is_mla[i]], [3, 6])
        self.assertEqual((c.block, c.eps, c.shared, c.scaling, c.top_k), (2, 1e-3, 1, 2.0, 2))
        read = S.tensor_reader(fx("variant"))
        f_a = read("model.layers.0.self_attn.f_a_proj.weight")[0]
        self.assertEqual(f_a.shape[0], 24)
        self.assertNotEqual(f_a.shape[0], c.kda_dim)
        # F32 tensors carry full f32 mantissas (as the real checkpoint's do), not BF16 values.
        for name in ("A_log", "dt_bias", "q_conv1d.weight", "o_norm.weight"):
            bits = read(f"model.layers.0.self_attn.{name}")[0].astype(np.float32).view(np.uint32)
            self.assertTrue(np.any(bits & 0xFFFF), name)
        bias = read("model.layers.1.block_sparse_moe.gate.e_score_correction_bias")[0]
        self.assertTrue(np.any(bias.astype(np.float32).view(np.uint32) & 0xFFFF))


class DecayAfterDelta(S.SpecReading):
    """Misreading: the delta error from the undecayed state."""

    @staticmethod
    def delta_rule(S_, q, k, v, alpha, beta):
        e = v - S_.T @ k
        S_ = alpha[:, None] * S_ + beta * np.outer(k, e)
        return S_, S_.T @ q


class ReadBeforeWrite(S.SpecReading):
    """Misreading: the output read from the state before the update."""

    @staticmethod
    def delta_rule(S_, q, k, v, alpha, beta):
        S_ = alpha[:, None] * S_
        o = S_.T @ q
        return S_ + beta * np.outer(k, v - S_.T @ k), o


class MixNormalised(S.SpecReading):
    """Misreading: AttnRes mixes the RMS-normalised candidates instead of the raw ones."""

    def mix(self, blocks, p, norm, proj):
        unit = [v / np.sqrt(np.mean(v * v) + self.eps) for v in blocks + [p]]
        score = np.array([u @ (self.w(norm) * self.w(proj)[0]) for u in unit])  # as the spec's
        pi = np.exp(score - score.max())
        pi /= pi.sum()
        return sum(pi_j * u_j for pi_j, u_j in zip(pi, unit))


class BiasedWeights(S.SpecReading):
    """Misreading: the routed weights from σ(r) + bias (the bias is for selection only)."""

    def route(self, r, bias):
        chosen = super().route(r, bias)
        s = 1.0 / (1.0 + np.exp(-r)) + bias
        total = sum(s[e] for e in chosen)
        return {e: s[e] / total * self.t["routed_scaling_factor"] for e in chosen}


class MisreadingsAreVisibleTest(unittest.TestCase):
    def test_each_misreading_moves_the_logits_far_beyond_the_tolerance(self):
        ids = ids_for("tiny", 8, 5)
        ref = reference_logits("tiny", ids)
        for cls in (DecayAfterDelta, ReadBeforeWrite, MixNormalised, BiasedWeights):
            self.assertGreater(worst_rel(cls(fx("tiny")).run(ids), ref), 1e-4, cls.__name__)
        # The vendor latent-norm epsilon 1e-6 (spec §3.9) against colibri's 1e-5.
        self.assertGreater(worst_rel(S.SpecReading(fx("tiny"), mla_eps=1e-5).run(ids), ref), 1e-4)


if __name__ == "__main__":
    unittest.main()
