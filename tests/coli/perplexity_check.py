#!/usr/bin/python3
"""`coli perplexity` against the independent float64 numpy reference (tools/k3/k3_ref.py).

usage: perplexity_check.py BIN_DIR FIXTURE_DIR

The tiny K3 fixture at f32 (K3_BITS / K3_MLA_BITS / K3_HEAD_BITS 32, K3_IDOT=0, where issue #5
holds the engine to rel-L2 1e-5 per position): `coli perplexity --ctx 48 --chunks 3 --json` on a
text must give the perplexity computed here from the reference's logits of the same chunks
(llama-perplexity's method: each chunk of ctx tokens read alone, scored on tokens ctx/2 + 1 …
ctx - 1), within a relative 1e-5; the standard error too. Then the usage errors: no FILE, a
missing file, --ctx below 4, a text shorter than one chunk, non-UTF-8 input.
"""
import json
import math
import os
import random
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REF = os.path.join(HERE, '..', '..', 'tools', 'k3', 'k3_ref.py')
F32 = {'K3_BITS': '32', 'K3_MLA_BITS': '32', 'K3_HEAD_BITS': '32', 'K3_IDOT': '0'}
CTX, CHUNKS = 48, 3


def fail(why):
    print('FAIL:', why)
    sys.exit(1)


def main():
    bin_dir, fixture = sys.argv[1], sys.argv[2]
    coli = os.path.join(bin_dir, 'coli')
    env = dict(os.environ, **F32)
    rng = random.Random(7)
    words = ('river stone light over under quiet morning number seven table window green '
             'small large city road north south winter summer').split()
    text = ' '.join(rng.choice(words) for _ in range(300))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, 'text.txt')
        with open(path, 'w') as f:
            f.write(text)
        run = subprocess.run([coli, 'perplexity', '--model', fixture, '--ctx', str(CTX),
                              '--chunks', str(CHUNKS), '--json', path],
                             env=env, capture_output=True, text=True, timeout=300)
        if run.returncode != 0:
            fail(f'coli perplexity exited {run.returncode}: {run.stderr}')
        got = json.loads(run.stdout)
        ids = json.loads(subprocess.run([coli, 'tokenize', '--tokenizer', fixture], input=text,
                                        capture_output=True, text=True, check=True).stdout)
        if got['tokens'] != len(ids):
            fail(f"tokens {got['tokens']} != {len(ids)}")
        nlls = []
        first = CTX // 2
        for k in range(CHUNKS):
            chunk = ids[k * CTX:(k + 1) * CTX]
            out = os.path.join(tmp, f'ref{k}.f32')
            subprocess.run([sys.executable, REF, 'run', '--model', fixture, '--ids',
                            ','.join(map(str, chunk)), '--out-logits', out],
                           check=True, capture_output=True, timeout=300)
            logits = np.fromfile(out, dtype='<f4').astype(np.float64).reshape(CTX, -1)
            m = logits.max(axis=1, keepdims=True)
            logsm = logits - m - np.log(np.exp(logits - m).sum(axis=1, keepdims=True))
            for p in range(first + 1, CTX):
                nlls.append(-logsm[p - 1, chunk[p]])
        mean = sum(nlls) / len(nlls)
        ppl = math.exp(mean)
        var = sum(x * x for x in nlls) / len(nlls) - mean * mean
        err = ppl * math.sqrt(var / (len(nlls) - 1))
        print(f"coli: ppl {got['ppl']:.6f} +/- {got['ppl_stderr']:.6f} over {got['scored']}; "
              f'reference: {ppl:.6f} +/- {err:.6f} over {len(nlls)}')
        if got['scored'] != len(nlls) or got['chunks'] != CHUNKS or got['ctx'] != CTX:
            fail(f'counts {got}')
        if abs(got['ppl'] - ppl) / ppl > 1e-5:
            fail(f"ppl {got['ppl']} vs reference {ppl}")
        if abs(got['ppl_stderr'] - err) / err > 1e-4:
            fail(f"ppl_stderr {got['ppl_stderr']} vs reference {err}")

        # Usage errors: exit 2 with a message naming the problem; a short text exits 1.
        short = os.path.join(tmp, 'short.txt')
        with open(short, 'w') as f:
            f.write('too short')
        bad = os.path.join(tmp, 'bad.txt')
        with open(bad, 'wb') as f:
            f.write(b'caf\xff')
        cases = [([], 2, 'FILE is required'),
                 ([os.path.join(tmp, 'missing.txt')], 2, 'cannot read'),
                 (['--ctx', '2', path], 2, '--ctx'),
                 ([bad], 2, 'not valid UTF-8'),
                 (['--ctx', '64', short], 1, 'at least one chunk')]
        for extra, code, words_expected in cases:
            r = subprocess.run([coli, 'perplexity', '--model', fixture] + extra, env=env,
                               capture_output=True, text=True, timeout=300)
            if r.returncode != code or words_expected not in r.stderr:
                fail(f'{extra}: exit {r.returncode}, stderr {r.stderr!r}')
    print('PASS')


if __name__ == '__main__':
    main()
