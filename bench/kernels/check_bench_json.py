#!/usr/bin/env python3
"""Smoke test: `coli bench kernels --quick --json` prints one well-formed JSON object."""
import json
import math
import os
import subprocess
import sys

FORMATS = {"mxfp4", "mxfp4_idot", "int8", "int4g64", "f32"}


def expected_isa():
    """The kernels' level from /proc/cpuinfo's flags, as the dispatcher should choose it (None
    where the file is missing or COLI_ISA forces a level)."""
    if os.environ.get("COLI_ISA"):
        return None
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            line = next((l for l in f if l.startswith("flags")), "")
    except OSError:
        return None
    flags = set(line.split(":", 1)[-1].split())
    if not flags:
        return None
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512vbmi",
            "fma"} <= flags:
        return "avx512"
    if {"avx2", "fma"} <= flags:
        return "avxvnni" if "avx_vnni" in flags else "avx2"
    return "scalar"


def main() -> int:
    coli = sys.argv[1]
    # --row-streams 1: a count no CPU defaults to (2 or 4), so the JSON shows the flag reached the
    # kernels.
    out = subprocess.run([coli, "bench", "kernels", "--quick", "--json", "--threads", "2",
                          "--row-streams", "1"],
                         check=True, stdout=subprocess.PIPE).stdout.decode()
    doc = json.loads(out)  # exactly one object: json.loads refuses trailing text
    assert set(doc) == {"read_bw_gbs", "read_bw_start_gbs", "read_bw_end_gbs", "read_bw_mean_gbs",
                        "isa", "threads", "row_streams", "results"}, doc.keys()
    assert doc["row_streams"] == 1, doc["row_streams"]
    assert doc["threads"] == 2, doc["threads"]
    expected = expected_isa()
    assert expected is None or doc["isa"] == expected, (doc["isa"], expected)
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
