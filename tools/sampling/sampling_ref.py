#!/usr/bin/env python3
"""Independent numpy reference for coli's sampling knobs (docs/status/sampling.md).

For fixed logits, prompt/output histories and knobs it computes the distribution the sampler
draws from, following vLLM / OpenAI:

  logit_bias (added) -> repetition_penalty (prompt or output tokens: l > 0 ? l / r : l * r)
  -> frequency_penalty (minus f * output count) -> presence_penalty (minus p if in the output)
  -> temperature -> top_k -> top_p -> min_p (p >= min_p * p_max) -> renormalise.
  Greedy (temperature <= 0): probability 1 at the first maximum of the penalised logits.

The penalty arithmetic is done in float32, as vLLM does on float32 logits (so exact ties stay
ties on both sides); temperature and softmax in float64.

Usage: sampling_ref.py CASES_FILE  -> one line per case on stdout: "NAME p_0 p_1 ... p_{V-1}".

CASES_FILE holds blocks of whitespace-separated fields (floats as C99 hex, e.g. 0x1.8p+0):
  case NAME
  order ORDER          # vllm | bias_after_repetition | penalties_after_temperature |
                       # min_p_before_top_p (deliberately wrong orders, for tests that must fail)
  knobs T TOP_P TOP_K MIN_P REP FREQ PRES
  logits N v_0 ... v_{N-1}
  prompt N ids...
  output N ids...      # the generated tokens in order (counts are taken from it)
  bias N id_0 b_0 id_1 b_1 ...
  end
"""
import sys

import numpy as np


def _bias(l, bias):
    l = l.copy()
    for tid, b in bias:
        l[tid] = np.float32(l[tid] + np.float32(b))
    return l


def _repetition(l, r, prompt, output):
    if r <= 0 or r == 1:
        return l
    r = np.float32(r)
    mask = np.zeros(l.shape[0], dtype=bool)
    mask[np.asarray(prompt, dtype=np.int64)] = True
    mask[np.asarray(output, dtype=np.int64)] = True
    penalised = np.where(l > 0, l / r, l * r).astype(np.float32)
    return np.where(mask, penalised, l).astype(np.float32)


def _frequency_presence(l, f, p, output):
    counts = np.bincount(np.asarray(output, dtype=np.int64), minlength=l.shape[0])
    counts = counts.astype(np.float32)
    l = (l - np.float32(f) * counts).astype(np.float32)
    l = (l - np.float32(p) * (counts > 0).astype(np.float32)).astype(np.float32)
    return l


def _penalise(l, knobs, prompt, output, bias, order):
    _, _, _, _, rep, freq, pres = knobs
    if order == "bias_after_repetition":
        l = _repetition(l, rep, prompt, output)
        l = _bias(l, bias)
    else:
        l = _bias(l, bias)
        l = _repetition(l, rep, prompt, output)
    return _frequency_presence(l, freq, pres, output)


def _cut_sorted(p, top_k, top_p, min_p, order):
    """p: unnormalised float64 probabilities. Returns the kept ids (sorted order)."""
    ids = np.arange(p.shape[0])
    idx = np.lexsort((ids, -p))  # descending probability, ties: lower id first
    sp = p[idx]
    keep = p.shape[0]
    total = p.sum()

    def apply_min_p(keep):
        if min_p > 0:
            thr = float(np.float32(min_p)) * sp[0]
            keep = min(keep, max(1, int(np.count_nonzero(sp[:keep] >= thr))))
        return keep

    if order == "min_p_before_top_p":
        keep = apply_min_p(keep)
        total = sp[:keep].sum()
    if 0 < top_k < keep:
        keep = top_k
    if 0 < top_p < 1:
        cum = np.cumsum(sp[:keep])
        reach = np.nonzero(cum >= float(np.float32(top_p)) * total)[0]
        keep = int(reach[0]) + 1 if reach.size else keep
    if order != "min_p_before_top_p":
        keep = apply_min_p(keep)
    return idx[:keep]


def processed(logits, knobs, prompt, output, bias, order="vllm"):
    t, top_p, top_k, min_p, _, _, _ = knobs
    l = np.asarray(logits, dtype=np.float32)
    if order == "penalties_after_temperature" and t > 0:
        l = (l.astype(np.float64) / float(np.float32(t))).astype(np.float32)
        l = _penalise(l, knobs, prompt, output, bias, "vllm")
        z = l.astype(np.float64)
    else:
        l = _penalise(l, knobs, prompt, output, bias, order)
        if t <= 0:
            out = np.zeros(l.shape[0])
            out[int(np.argmax(l))] = 1.0
            return out
        z = l.astype(np.float64) / float(np.float32(t))
    p = np.exp(z - z.max())
    kept = _cut_sorted(p, int(top_k), top_p, min_p, order)
    out = np.zeros(l.shape[0])
    out[kept] = p[kept] / p[kept].sum()
    return out


def _read_cases(text):
    f = text.split()
    i = 0
    cases = []

    def take(n=1):
        nonlocal i
        v = f[i:i + n]
        i += n
        return v

    def floats(v):
        return [float.fromhex(x) for x in v]

    def counted(kind):
        n = int(take()[0])
        return take(n * (2 if kind == "bias" else 1))

    while i < len(f):
        key = take()[0]
        if key != "case":
            raise SystemExit(f"sampling_ref: expected 'case', got {key!r}")
        c = {"name": take()[0], "order": "vllm", "prompt": [], "output": [], "bias": []}
        while True:
            key = take()[0]
            if key == "end":
                break
            if key == "order":
                c["order"] = take()[0]
            elif key == "knobs":
                v = take(7)
                c["knobs"] = floats(v[:2]) + [int(v[2])] + floats(v[3:])
            elif key == "logits":
                c["logits"] = floats(counted("logits"))
            elif key in ("prompt", "output"):
                c[key] = [int(x) for x in counted(key)]
            elif key == "bias":
                v = counted("bias")
                c["bias"] = [(int(v[k]), float.fromhex(v[k + 1])) for k in range(0, len(v), 2)]
            else:
                raise SystemExit(f"sampling_ref: unknown field {key!r} in case {c['name']}")
        cases.append(c)
    return cases


def main(argv):
    if len(argv) != 2:
        raise SystemExit(__doc__)
    with open(argv[1]) as fh:
        cases = _read_cases(fh.read())
    for c in cases:
        p = processed(c["logits"], c["knobs"], c["prompt"], c["output"], c["bias"], c["order"])
        print(c["name"], " ".join(repr(float(x)) for x in p))


if __name__ == "__main__":
    main(sys.argv)
