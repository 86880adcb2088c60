#!/usr/bin/env python3
"""Smoke test: `coli bench vk --quick --json` prints one well-formed, self-consistent JSON object,
and so does `coli bench vk --dense --quick --json` (the shared experts' block, COLI_VK_DENSE), with
the exact-float numerics and with --idot (K3_IDOT=1: the CPU's bits, no output differing).

Runs twice: as the device is (direct mapping on lavapipe) and with COLI_VK_STAGING=1 (staged
device-local residency). Without any Vulkan device (`coli` exits 3) it skips (exit 77), unless
COLI_REQUIRE_VULKAN=1, where that is a failure.
"""
import json
import math
import os
import subprocess
import sys

TOP = {"device", "device_index", "staging", "latent", "inter", "experts", "expert_device_bytes",
       "upload_gbs", "h2d_copy_gbs", "upload_ratio", "device_bw_bytes", "device_bw_gbs",
       "results"}
RESULT = {"pairs", "experts", "seconds", "gflops", "weight_gbs", "bw_ratio", "cpu_seconds",
          "cpu_gflops", "speedup", "rel_l2"}


def close(a, b, rel=2e-3):
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-12)


def check(coli, staging):
    env = dict(os.environ)
    env["COLI_VK_STAGING"] = "1" if staging else "0"
    run = subprocess.run([coli, "bench", "vk", "--quick", "--json"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if run.returncode == 3:
        sys.stderr.write(run.stderr.decode())
        if os.environ.get("COLI_REQUIRE_VULKAN") == "1":
            print("FAIL: COLI_REQUIRE_VULKAN=1 but coli bench vk found no Vulkan device")
            sys.exit(1)
        print("skip: no Vulkan device")
        sys.exit(77)
    assert run.returncode == 0, (run.returncode, run.stderr.decode())
    doc = json.loads(run.stdout.decode())  # exactly one object: json.loads refuses trailing text
    assert set(doc) == TOP, sorted(set(doc) ^ TOP)
    assert isinstance(doc["device"], str) and doc["device"], doc
    if staging:
        assert doc["staging"] is True, doc  # forced
    assert doc["latent"] == 256 and doc["inter"] == 128 and doc["experts"] >= 1, doc
    # The device allocates at least the e2m1 bytes and the f32 scales of the three matrices.
    i, h = doc["inter"], doc["latent"]
    assert doc["expert_device_bytes"] >= 3 * (i * h // 2 + i * h // 32 * 4), doc
    for key in ("upload_gbs", "h2d_copy_gbs", "device_bw_gbs"):
        assert doc[key] > 0 and math.isfinite(doc[key]), (key, doc)
    assert close(doc["upload_ratio"], doc["upload_gbs"] / doc["h2d_copy_gbs"]), doc
    assert doc["device_bw_bytes"] > 0, doc
    pairs = [r["pairs"] for r in doc["results"]]
    assert pairs == [1, 4], pairs
    for r in doc["results"]:
        assert set(r) == RESULT, sorted(set(r) ^ RESULT)
        assert r["experts"] == doc["experts"], r
        assert r["seconds"] > 0 and r["cpu_seconds"] > 0, r
        flops = 2.0 * 3 * i * h * r["pairs"] * r["experts"]
        assert close(r["gflops"], flops / r["seconds"] / 1e9), r
        assert close(r["cpu_gflops"], flops / r["cpu_seconds"] / 1e9), r
        weights = doc["expert_device_bytes"] * r["experts"]
        assert close(r["weight_gbs"], weights / r["seconds"] / 1e9), r
        assert close(r["bw_ratio"], r["weight_gbs"] / doc["device_bw_gbs"]), r
        assert close(r["speedup"], r["cpu_seconds"] / r["seconds"]), r
        # The device computes the CPU's exact-float expert up to summation order.
        assert 0 <= r["rel_l2"] <= 1e-5, r
    return doc


DENSE_TOP = {"device", "device_index", "staging", "mode", "hidden", "inner", "format", "numerics",
             "dense_device_bytes", "upload_gbs", "device_bw_bytes", "device_bw_gbs", "results"}
DENSE_RESULT = {"rows", "seconds", "weight_gbs", "bw_ratio", "cpu_seconds", "speedup", "rel_l2",
                "mismatches"}


def check_dense(coli, staging, idot):
    env = dict(os.environ)
    env["COLI_VK_STAGING"] = "1" if staging else "0"
    args = [coli, "bench", "vk", "--dense", "--quick", "--json"] + (["--idot"] if idot else [])
    run = subprocess.run(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert run.returncode == 0, (run.returncode, run.stderr.decode())
    doc = json.loads(run.stdout.decode())
    assert set(doc) == DENSE_TOP, sorted(set(doc) ^ DENSE_TOP)
    assert doc["mode"] == "dense" and doc["format"] == "int4g64", doc
    assert doc["numerics"] == ("idot" if idot else "float"), doc
    if staging:
        assert doc["staging"] is True, doc
    h, i = doc["hidden"], doc["inner"]
    assert (h, i) == (256, 384), doc
    # gate and up [i, h], down [h, i]: int4 nibbles and one f32 scale per 64 columns each.
    assert doc["dense_device_bytes"] >= 3 * (i * h // 2 + i * h // 64 * 4), doc
    for key in ("upload_gbs", "device_bw_gbs"):
        assert doc[key] > 0 and math.isfinite(doc[key]), (key, doc)
    assert [r["rows"] for r in doc["results"]] == [1, 4], doc["results"]
    for r in doc["results"]:
        assert set(r) == DENSE_RESULT, sorted(set(r) ^ DENSE_RESULT)
        assert r["seconds"] > 0 and r["cpu_seconds"] > 0, r
        assert close(r["weight_gbs"], doc["dense_device_bytes"] / r["seconds"] / 1e9), r
        assert close(r["bw_ratio"], r["weight_gbs"] / doc["device_bw_gbs"]), r
        assert close(r["speedup"], r["cpu_seconds"] / r["seconds"]), r
        if idot:
            # The integer-dot block is the CPU's bit for bit.
            assert r["rel_l2"] == 0 and r["mismatches"] == 0, r
        else:
            # The device computes the CPU's exact-float block up to summation order.
            assert 0 <= r["rel_l2"] <= 1e-5, r
            assert 0 <= r["mismatches"] <= r["rows"] * h, r
    return doc


def main() -> int:
    coli = sys.argv[1]
    for staging in (False, True):
        doc = check(coli, staging)
        chain = ", ".join("%.2f" % r["gflops"] for r in doc["results"])
        print(f"ok: {doc['device']} staging={doc['staging']}: upload {doc['upload_gbs']:.2f} GB/s "
              f"(ratio {doc['upload_ratio']:.2f}), device bw {doc['device_bw_gbs']:.2f} GB/s, "
              f"chain {chain} GFLOPS")
        for idot in (False, True):
            dense = check_dense(coli, staging, idot)
            print(f"ok: dense {dense['numerics']} staging={dense['staging']}: upload "
                  f"{dense['upload_gbs']:.2f} GB/s, "
                  f"rel-L2 {max(r['rel_l2'] for r in dense['results']):.2e}, "
                  f"{sum(r['mismatches'] for r in dense['results'])} outputs differ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
