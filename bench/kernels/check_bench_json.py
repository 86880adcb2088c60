#!/usr/bin/env python3
"""Smoke test: `coli bench kernels --quick --json` prints one well-formed JSON object."""
import json
import math
import subprocess
import sys

FORMATS = {"mxfp4", "mxfp4_idot", "int8", "int4g64", "f32"}


def main() -> int:
    coli = sys.argv[1]
    # --row-streams 2: a count no CPU defaults to, so the JSON shows the flag reached the kernels.
    out = subprocess.run([coli, "bench", "kernels", "--quick", "--json", "--threads", "2",
                          "--row-streams", "2"],
                         check=True, stdout=subprocess.PIPE).stdout.decode()
    doc = json.loads(out)  # exactly one object: json.loads refuses trailing text
    assert set(doc) == {"read_bw_gbs", "read_bw_start_gbs", "read_bw_end_gbs", "read_bw_mean_gbs",
                        "row_streams", "results"}, doc.keys()
    assert doc["row_streams"] == 2, doc["row_streams"]
    bad = subprocess.run([coli, "bench", "kernels", "--row-streams", "3"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert bad.returncode == 2 and b"--row-streams needs 1, 2 or 4" in bad.stderr, bad
    assert doc["read_bw_gbs"] > 0, doc["read_bw_gbs"]
    # The sustained rate (all passes) cannot beat the best pass.
    assert 0 < doc["read_bw_mean_gbs"] <= doc["read_bw_gbs"] * (1 + 1e-9), doc
    # The ratios use the better of the probes run before and after the kernels.
    assert doc["read_bw_gbs"] == max(doc["read_bw_start_gbs"], doc["read_bw_end_gbs"]), doc
    seen = set()
    for r in doc["results"]:
        assert set(r) == {"format", "rows", "cols", "batch", "gflops", "weight_gbs", "bw_ratio",
                          "weight_gbs_mean", "bw_ratio_mean", "bw_ratio_paired"}, r
        assert r["format"] in FORMATS, r
        assert r["rows"] > 0 and r["cols"] > 0 and r["batch"] >= 1, r
        assert r["gflops"] > 0 and r["weight_gbs"] > 0, r
        assert abs(r["bw_ratio"] - r["weight_gbs"] / doc["read_bw_gbs"]) < 1e-3 * max(1, r["bw_ratio"]), r
        # The best window cannot be slower than all windows together.
        assert 0 < r["weight_gbs_mean"] <= r["weight_gbs"] * (1 + 1e-6), r
        assert abs(r["bw_ratio_mean"] - r["weight_gbs_mean"] / doc["read_bw_mean_gbs"]) < 1e-3 * max(1, r["bw_ratio_mean"]), r
        # The paired ratio (median over windows of window / adjacent probe pass) is a plain
        # positive number; a kernel that reads less than its weights cannot pass for one that
        # reads them 100 times faster than the memory.
        assert 0 < r["bw_ratio_paired"] < 100 and math.isfinite(r["bw_ratio_paired"]), r
        # GFLOPS and GB/s describe the same (best) window.
        per_call = r["rows"] * r["cols"] * r["batch"] * 2 / (r["gflops"] * 1e9)
        assert per_call > 0, r
        seen.add(r["format"])
    assert seen == FORMATS, seen
    print(f"ok: {len(doc['results'])} results, read bandwidth {doc['read_bw_gbs']:.1f} GB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
