#!/usr/bin/env python3
"""Smoke test: `coli bench kda --quick --json` prints one well-formed JSON object."""
import json
import math
import subprocess
import sys


def main() -> int:
    coli = sys.argv[1]
    out = subprocess.run([coli, "bench", "kda", "--quick", "--json", "--threads", "2",
                          "--rows", "1,3"], check=True, stdout=subprocess.PIPE).stdout.decode()
    doc = json.loads(out)  # exactly one object: json.loads refuses trailing text
    assert set(doc) == {"isa", "threads", "heads", "head_dim", "layers", "state_bytes",
                        "read_bw_gbs", "read_bw_start_gbs", "read_bw_end_gbs", "identical",
                        "clock", "results"}, doc.keys()
    assert doc["isa"] in {"scalar", "avx2", "avx512"}, doc["isa"]
    assert (doc["heads"], doc["head_dim"], doc["threads"]) == (96, 128, 2), doc
    assert doc["state_bytes"] == doc["layers"] * 96 * 128 * 128 * 4, doc
    assert doc["identical"] is True, doc
    assert doc["clock"] == "wall", doc
    assert doc["read_bw_gbs"] == max(doc["read_bw_start_gbs"], doc["read_bw_end_gbs"]) > 0, doc
    seen = set()
    for r in doc["results"]:
        assert set(r) == {"path", "rows", "tokens_per_s", "ms_per_token_k3", "ms_per_chunk_k3",
                          "bytes_per_token", "gbs", "bw_ratio", "bw_ratio_paired",
                          "speedup"}, r
        n = r["rows"]
        assert r["path"] in {"rowwise", "heads"} and n in {1, 3}, r
        assert r["tokens_per_s"] > 0 and math.isfinite(r["tokens_per_s"]), r
        # Traffic model: the whole state read + written per row (rowwise) or per chunk (heads).
        per_chunk = 2 * doc["state_bytes"]
        want = per_chunk if r["path"] == "rowwise" else per_chunk / n
        assert abs(r["bytes_per_token"] - want) <= 1e-6 * want + 1, (r, want)
        assert abs(r["gbs"] - r["bytes_per_token"] * r["tokens_per_s"] / 1e9) < 1e-3 * max(1, r["gbs"]), r
        assert abs(r["bw_ratio"] - r["gbs"] / doc["read_bw_gbs"]) < 1e-3 * max(1, r["bw_ratio"]), r
        assert 0 < r["bw_ratio_paired"] < 100, r
        # ms per K3 token (69 layers) and per chunk agree with tokens/s over this run's layers.
        ms = 1e3 / r["tokens_per_s"] * 69 / doc["layers"]
        assert abs(r["ms_per_token_k3"] - ms) < 1e-3 * ms + 1e-4, (r, ms)
        assert abs(r["ms_per_chunk_k3"] - ms * n) < 1e-3 * ms * n + 1e-4, r
        if r["path"] == "rowwise":
            assert abs(r["speedup"] - 1) < 1e-9, r
        seen.add((r["path"], n))
    assert seen == {(p, n) for p in ("rowwise", "heads") for n in (1, 3)}, seen
    print(f"ok: {len(doc['results'])} results, isa {doc['isa']}, "
          f"read bandwidth {doc['read_bw_gbs']:.1f} GB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
