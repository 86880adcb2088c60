#!/usr/bin/python3
"""Writes a small Kimi K3 Hugging Face snapshot with the real on-disk layout and RANDOM weights.

The snapshot mirrors moonshotai/Kimi-K3 (spec kimi_k3_model.md §1, §2, §4.1, §5.1) with small
widths: the multimodal config wrapper with `text_config` nesting and 1-based layer lists, one
shard per decoder layer (its experts' six tensors back to back, experts in shuffled order), a
globals shard, two vision shards that a text engine never opens, the index, a rank-BPE
`tiktoken.model` learned from an embedded English/Chinese text, `tokenizer_config.json` with the
K3 layout of the 256 reserved ids, and `generation_config.json`. Every weight is random: the
config carries `"coli_fixture": "random weights, not a real model"` and a README.txt says so.

Presets (see FIXTURE.md for every dimension):
  tiny          13 layers (MLA at 0-based 3, 7, 11, 12), AttnRes blocks of 5 (last one partial)
  tiny-ties     8 layers (MLA at 3, 7: "every 4th" and the last), blocks of 3, router rows
                duplicated so sigmoid scores tie exactly, a correction bias that changes picks
  tiny-variant  6 layers (MLA listed as 3 and 6), blocks of 2, eps 1e-3, one shared expert,
                routed_scaling_factor 2, decay rank != head_dim, full-precision F32 tensors
  vendor-f32    spec §9.8's vendor-code fixture: its shapes (hidden 64, 6 layers, MLA at 3 and
                6, ...), EVERY tensor F32 with full mantissas, routed experts as plain
                w{1,2,3}.weight F32 matrices (no MXFP4), no quantization_config (a torch
                save_pretrained of the vendor modeling code with experts kept in f32)
  real-experts  routed experts of the real K3 size (latent 3584, inter 3072, 17,547,264 bytes
                each) with small attention widths, for the streaming benchmark; streamed out
  real-widths   every K3 width for 2 layers (KDA + dense, MLA + LatentMoE), 32 experts, tiny
                vocabulary: for timing the forward pass at real widths (~3.8 GB)

Usage:
  make_fixture.py OUT_DIR [--preset tiny|tiny-ties|tiny-variant|vendor-f32|real-experts|real-widths]
                  [--seed N]
                  [--no-prefix]
                  [--moe-layers N] [--experts N] [--top-k N] [--quiet]

Only Debian's python3 + python3-numpy. Output is written to a temporary folder beside OUT_DIR
and renamed into place, so OUT_DIR is either complete or absent.
"""

import argparse
import base64
import json
import os
import re
import shutil
import struct
import sys
import time

import numpy as np

FIXTURE_LABEL = "random weights, not a real model"
# Gains chosen so the random stack is well conditioned: an all-f32 evaluation stays within
# ~2e-6 (logits) of float64 and a 1e-7 input perturbation grows < 10x over the stack (with unit
# gains it grew 100-600x, which no f32 engine could match to 1e-5). RES_GAIN scales the AttnRes
# score vectors (trained K3 has small score margins), OUT_GAIN every sublayer's last matrix.
RES_GAIN = 0.5
OUT_GAIN = 0.25

# ---------------------------------------------------------------------------------------------
# Presets. Widths are small but every ratio that matters to the engine's control flow is kept.


def _mla_list(num_layers):
    """1-based MLA layers as in K3: every 4th layer plus the last one."""
    out = [i for i in range(4, num_layers + 1, 4)]
    if num_layers not in out:
        out.append(num_layers)
    return out


_TINY = dict(
    hidden=64, layers=13, block=5, rms_eps=1e-5,
    kda_heads=4, kda_head_dim=32, kda_rank=32, a_log_len=32, conv=4,
    mla_heads=2, q_lora=64, kv_lora=64, nope=32, extra=16, v_dim=32,
    dense_inter=128, experts=16, top_k=4, shared=2, moe_inter=96, latent=64,
    scaling=1.0, ties=False, merges=256,
)
PRESETS = {
    "tiny": _TINY,
    # Different widths everywhere, so an engine that hard-codes one of them is caught.
    "tiny-ties": dict(_TINY, layers=8, block=3, rms_eps=1e-4, kda_heads=2, kda_head_dim=16,
                      kda_rank=16, a_log_len=2, mla_heads=4, q_lora=32, kv_lora=32, nope=16,
                      extra=8, v_dim=16, dense_inter=96, experts=8, top_k=3, moe_inter=64,
                      latent=32, ties=True),
    # The values a reader of the spec could pick that the other presets do not (spec §9.8's
    # oracle config: 6 layers with the MLA layers listed as 3 and 6, AttnRes blocks of 2,
    # rms_norm_eps 1e-3, one shared expert, routed_scaling_factor 2, experts top-2 of 8 with
    # latent = inter = 32), plus a decay rank (24) that is not head_dim and F32 tensors with
    # full f32 mantissas, as the real checkpoint's are (the other presets round them to BF16).
    "tiny-variant": dict(_TINY, layers=6, full=[3, 6], block=2, rms_eps=1e-3, kda_heads=2,
                         kda_rank=24, a_log_len=2, q_lora=32, kv_lora=32, dense_inter=64,
                         experts=8, top_k=2, shared=1, moe_inter=32, latent=32, scaling=2.0,
                         f32_full=True),
    # Spec §9.8's vendor-code fixture as far as the spec states it: hidden 64, intermediate 64,
    # 6 layers with MLA at 1-based 3 and 6, MLA heads 2, q_lora 32, kv_lora 32, nope 32, extra
    # 16, v 32; KDA 2 heads x 32 (full-rank gate: decay rank = head_dim), conv 4; 8 experts top-2,
    # 1 shared, expert inter 32, latent 32, routed_scaling_factor 2, first dense 1, AttnRes
    # blocks of 2, rms_norm_eps 1e-3. What save_pretrained writes for it: every tensor F32 with
    # full mantissas (dense matrices, norms and the embedding included), the routed experts as
    # plain linear weights experts.{e}.w{1,2,3}.weight F32 (logical shapes, spec §2.3) instead of
    # weight_packed + weight_scale, and no quantization_config. The vocabulary stays the
    # fixtures' small tokenizer's; the values follow this file's conventions (not §9.8's
    # torch draws). Layer 4 stores its experts matrix-major (all w1, then all w2, all w3), so
    # an expert is not one contiguous range there (the engine's six/three-read path).
    "vendor-f32": dict(_TINY, layers=6, full=[3, 6], block=2, rms_eps=1e-3, kda_heads=2,
                       kda_head_dim=32, kda_rank=32, a_log_len=32, q_lora=32, kv_lora=32,
                       nope=32, extra=16, v_dim=32, dense_inter=64, experts=8, top_k=2, shared=1,
                       moe_inter=32, latent=32, scaling=2.0, f32_full=True, all_f32=True,
                       experts_f32=True, no_quant_config=True, matrix_major_layers=[4]),
    "real-experts": dict(_TINY, hidden=256, layers=5, block=12, dense_inter=256, experts=64,
                         top_k=16, moe_inter=3072, latent=3584),
    # Every width of K3 (spec §1.2) but 2 layers (KDA + dense MLP, MLA + LatentMoE), 32 experts
    # and the tiny vocabulary: for timing the forward pass at real widths (~4 GB).
    "real-widths": dict(_TINY, hidden=7168, layers=2, block=12, kda_heads=96, kda_head_dim=128,
                        kda_rank=128, a_log_len=128, mla_heads=96, q_lora=1536, kv_lora=512,
                        nope=128, extra=64, v_dim=128, dense_inter=33792, experts=32, top_k=16,
                        moe_inter=3072, latent=3584),
}

# ---------------------------------------------------------------------------------------------
# Numbers


def to_bf16_bits(x):
    """float array -> uint16 BF16 bits, round to nearest even (values are finite)."""
    f = np.ascontiguousarray(np.asarray(x, dtype=np.float32))
    u = f.view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def bf16_round_f32(x):
    """The nearest BF16 value as float32 (so F32 tensors hold BF16-exact values too)."""
    return (to_bf16_bits(x).astype(np.uint32) << 16).view(np.float32)


class Gen:
    """Random tensors in the fixture's value conventions (all BF16-exact)."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)

    def dense(self, rows, cols, gain=1.0, lazy=True):
        """N(0, gain²/cols) entries; big ones (lazy=True) come back as a LazyMatrix."""
        if lazy and rows * cols > LAZY_ELEMENTS:
            return LazyMatrix(rows, cols, gain / np.sqrt(cols), int(self.rng.integers(2**63)))
        return self.rng.standard_normal((rows, cols)) * (gain / np.sqrt(cols))

    def norm_w(self, n):
        return 1.0 + 0.2 * self.rng.standard_normal(n)

    def normal(self, shape, std):
        return self.rng.standard_normal(shape) * std

    def mxfp4(self, rows, cols):
        """Random e2m1 codes (all 16) packed low nibble = even column, E8M0 scales near the value
        that keeps rows * x at unit size."""
        packed = self.rng.integers(0, 256, size=(rows, cols // 2), dtype=np.uint8)
        center = int(round(127 - np.log2(2.93 * np.sqrt(cols))))
        scale = self.rng.integers(center - 2, center + 2, size=(rows, cols // 32), dtype=np.uint8)
        return packed, scale


# ---------------------------------------------------------------------------------------------
# A streaming safetensors writer: header from (name, dtype, shape, nbytes), then data in order.

_DTYPE_SIZE = {"BF16": 2, "F32": 4, "U8": 1}


def dense_tensor(p, name, values):
    """A tensor spec §2.3 lists as BF16: BF16, or (preset all_f32) F32 with full mantissas."""
    if p.get("all_f32"):
        return f32_tensor(name, values, full=True)
    return bf16_tensor(name, values)


class Tensor:
    """One tensor to write: `data` is bytes, or a callable returning bytes (generated late so a
    big shard is never held in memory)."""

    def __init__(self, name, dtype, shape, data):
        self.name, self.dtype, self.shape, self.data = name, dtype, list(shape), data
        self.nbytes = int(np.prod(shape, dtype=np.int64)) * _DTYPE_SIZE[dtype]


# Matrices above this many elements (only in the real-widths preset) are generated in row
# blocks while they are written, from their own seeded generator, so RAM stays small.
LAZY_ELEMENTS = 16 << 20


class LazyMatrix:
    """A random normal matrix produced block by block as BF16 bytes."""

    def __init__(self, rows, cols, std, seed):
        self.shape, self.std, self.seed = (rows, cols), std, seed

    def chunks(self):
        rows, cols = self.shape
        rng = np.random.default_rng(self.seed)
        step = max(1, (8 << 20) // cols)
        for r0 in range(0, rows, step):
            n = min(step, rows - r0)
            block = rng.standard_normal((n, cols), dtype=np.float32) * np.float32(self.std)
            yield to_bf16_bits(block).tobytes()


def bf16_tensor(name, values):
    if isinstance(values, LazyMatrix):
        return Tensor(name, "BF16", values.shape, values.chunks)
    values = np.asarray(values)
    return Tensor(name, "BF16", values.shape, to_bf16_bits(values).tobytes())


def f32_tensor(name, values, full=False):
    """F32 values rounded to BF16-exact ones, or (full) with all 24 mantissa bits."""
    values = np.asarray(values)
    data = values.astype("<f4") if full else bf16_round_f32(values)
    return Tensor(name, "F32", values.shape, data.tobytes())


def write_safetensors(path, tensors):
    """Writes tensors in list order; header keys sorted by name (as the Rust writer does), so
    header order differs from data order. Header padded with spaces to a multiple of 8."""
    offsets, pos = {}, 0
    for t in tensors:
        offsets[t.name] = (pos, pos + t.nbytes)
        pos += t.nbytes
    header = {"__metadata__": {"format": "pt"}}
    for t in sorted(tensors, key=lambda t: t.name):
        header[t.name] = {"dtype": t.dtype, "shape": t.shape,
                          "data_offsets": list(offsets[t.name])}
    hjson = json.dumps(header, separators=(",", ":")).encode()
    hjson += b" " * ((8 - (8 + len(hjson)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for t in tensors:
            data = t.data() if callable(t.data) else t.data
            written = 0
            for chunk in ([data] if isinstance(data, (bytes, bytearray)) else data):
                f.write(chunk)
                written += len(chunk)
            if written != t.nbytes:
                raise RuntimeError(f"tensor {t.name}: {written} bytes, expected {t.nbytes}")
    return pos


# ---------------------------------------------------------------------------------------------
# Tokenizer: rank-BPE vocabulary learned on an embedded text.

TRAIN_TEXT = """\
The quick brown fox jumps over the lazy dog. A language model reads text as a sequence of
tokens, and each token is a short run of bytes that appeared often in the training text.
Byte pair encoding starts from single bytes and repeatedly merges the most frequent pair of
neighbouring tokens, so common words such as "the", "and", "model" and "token" become one
token while rare words are spelled out from smaller pieces. The engine must reproduce the
merges exactly: it looks at every adjacent pair, picks the one whose joined bytes have the
lowest rank, and repeats until no joined pair is in the vocabulary. Numbers like 2026, 1024
and 3.14159 are split into groups of at most three digits. Punctuation, spaces, tabs and new
lines are kept as they are, because the model must be able to write code and poetry alike.
Mixture of experts layers send every token to a few of many small networks; the router
scores each expert, keeps the best ones and adds their answers with weights that sum to one.
Linear attention keeps a fixed-size state per head, decays it a little at every step and
writes the new key and value into it with the delta rule, so memory does not grow with the
length of the conversation. Full attention layers, placed every fourth layer, still look at
every earlier position through a small latent cache. Hello, world! How are you today? I am
fine, thank you, and you? Streaming the experts from a fast drive makes a very large model
run on a desktop computer, one token at a time, while the rest of the weights stay in memory.
人工智能正在改变我们的生活。语言模型把文本看作一串词元，每个词元是一小段经常出现的字节。
混合专家模型把每个词元交给少数几个专家网络，路由器给每个专家打分，选出最好的几个，
再按权重把它们的回答加起来。线性注意力为每个头保存一个固定大小的状态，每一步都让它
稍微衰减，并用增量规则写入新的键和值，所以内存不会随着对话变长而增长。今天天气很好，
我们一起去公园散步吧。中文和英文混合的文本也必须被正确地切分和编码。你好，世界！
"""

_HAN = "\u2e80-\u2e99\u2e9b-\u2ef3\u2f00-\u2fd5\u3005\u3007\u3021-\u3029\u3038-\u303b" \
       "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufa6d\ufa70-\ufad9"
# An approximation of the K3 split rules (spec §5.2) in Python's `re`: good enough to choose
# which merges to learn; the engine's tokenizer applies the exact rules to this vocabulary.
_PRETOK = re.compile(
    "[" + _HAN + "]+"
    r"|[^\r\n\w]?[^\W\d_" + _HAN + r"]+(?:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\d{1,3}"
    r"| ?[^\s\w]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def _byte_rank_order():
    """Single bytes in GPT-2/cl100k order (printable first), so rank != byte value."""
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    rest = [b for b in range(256) if b not in set(printable)]
    return printable + rest


def train_bpe(text, num_merges):
    """Returns the vocabulary as a list of byte strings; index = rank = token id."""
    vocab = [bytes([b]) for b in _byte_rank_order()]
    known = set(vocab)
    words = {}
    for piece in _PRETOK.findall(text):
        key = tuple(bytes([b]) for b in piece.encode("utf-8"))
        words[key] = words.get(key, 0) + 1
    words = [[list(k), n] for k, n in words.items()]
    merges = 0
    while merges < num_merges:
        counts = {}
        for toks, n in words:
            for a, b in zip(toks, toks[1:]):
                counts[(a, b)] = counts.get((a, b), 0) + n
        if not counts:
            break
        # Most frequent pair; ties broken by the joined bytes, so the result is deterministic.
        (a, b), _ = min(counts.items(), key=lambda kv: (-kv[1], kv[0][0] + kv[0][1]))
        joined = a + b
        if joined not in known:
            vocab.append(joined)
            known.add(joined)
            merges += 1
        for w in words:
            toks, out, i = w[0], [], 0
            while i < len(toks):
                if i + 1 < len(toks) and toks[i] == a and toks[i + 1] == b:
                    out.append(joined)
                    i += 2
                else:
                    out.append(toks[i])
                    i += 1
            w[0] = out
    if merges < num_merges:
        raise RuntimeError(f"BPE training text too short: {merges} of {num_merges} merges")
    return vocab


# The 256 reserved ids after the base vocabulary, as offsets from base (spec §5.1).
SPECIAL_OFFSETS = {
    0: "[BOS]", 1: "[EOS]", 2: "<|end_of_msg|>", 3: "<|open|>", 4: "<|close|>", 5: "<|sep|>",
    16: "<|kimi_image_placeholder|>", 17: "<|media_begin|>", 18: "<|media_content|>",
    19: "<|media_end|>", 21: "<|media_pad|>", 254: "[UNK]", 255: "[PAD]",
}


def write_tokenizer(out, vocab):
    base = len(vocab)
    with open(os.path.join(out, "tiktoken.model"), "w") as f:
        for rank, tok in enumerate(vocab):
            f.write(f"{base64.b64encode(tok).decode()} {rank}\n")
    added = {}
    for off in range(256):
        tid = base + off
        added[str(tid)] = {
            "content": SPECIAL_OFFSETS.get(off, f"<|reserved_token_{tid}|>"),
            "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": True,
        }
    cfg = {
        "added_tokens_decoder": added,
        "additional_special_tokens": [SPECIAL_OFFSETS[o] for o in (2, 3, 4, 5)],
        "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
        "bos_token": "[BOS]", "eos_token": "[EOS]", "pad_token": "[PAD]", "unk_token": "[UNK]",
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1048576,
        "tokenizer_class": "TikTokenTokenizer",
    }
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)
    return base


# ---------------------------------------------------------------------------------------------
# config.json


def make_config(p, base):
    L = p["layers"]
    full = p.get("full") or _mla_list(L)
    kda = [i for i in range(1, L + 1) if i not in full]
    vocab = base + 256
    text = {
        "architectures": ["KimiLinearForCausalLM"],
        "model_type": "kimi_linear",
        "auto_map": {"AutoConfig": "configuration_kimi_k3.KimiLinearConfig"},
        "hidden_size": p["hidden"],
        "num_hidden_layers": L,
        "vocab_size": vocab,
        "intermediate_size": p["dense_inter"],
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "num_attention_heads": p["mla_heads"],
        "num_key_value_heads": p["mla_heads"],
        "q_lora_rank": p["q_lora"],
        "kv_lora_rank": p["kv_lora"],
        "qk_nope_head_dim": p["nope"],
        "qk_rope_head_dim": p["extra"],
        "v_head_dim": p["v_dim"],
        "mla_use_nope": True,
        "mla_use_output_gate": True,
        "linear_attn_config": {
            "num_heads": p["kda_heads"],
            "head_dim": p["kda_head_dim"],
            "short_conv_kernel_size": p["conv"],
            "gate_lower_bound": -5.0,
            "use_full_rank_gate": True,
            "kda_layers": kda,
            "full_attn_layers": full,
        },
        "num_experts": p["experts"],
        "num_experts_per_token": p["top_k"],
        "num_shared_experts": p["shared"],
        "moe_intermediate_size": p["moe_inter"],
        "routed_expert_hidden_size": p["latent"],
        "latent_moe_use_norm": True,
        "moe_router_activation_func": "sigmoid",
        "moe_renormalize": True,
        "routed_scaling_factor": p["scaling"],
        "num_expert_group": 1,
        "topk_group": 1,
        "topk_method": "noaux_tc",
        "use_grouped_topk": True,
        "hidden_act": "situ",
        "activation_situ_beta": 4.0,
        "activation_situ_linear_beta": 25.0,
        "attn_res_block_size": p["block"],
        "rms_norm_eps": p["rms_eps"],
        "max_position_embeddings": 1048576,
        "num_nextn_predict_layers": 0,
        "tie_word_embeddings": False,
        "bos_token_id": base,
        "eos_token_id": base + 2,
        "pad_token_id": base + 255,
        "torch_dtype": "bfloat16",
        # Keys a transformers round-trip adds; meaningless for this model, must be ignored.
        "head_dim": p["hidden"] // p["mla_heads"],
        "rope_theta": 10000.0,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        "quantization_config": {
            "quant_method": "compressed-tensors",
            "format": "mxfp4-pack-quantized",
            "quantization_status": "compressed",
            "config_groups": {
                "group_0": {
                    "format": "mxfp4-pack-quantized",
                    "targets": ["Linear"],
                    "weights": {
                        "num_bits": 4, "type": "float", "strategy": "group",
                        "group_size": 32, "symmetric": True, "scale_dtype": "torch.uint8",
                        "dynamic": False, "observer": "minmax", "actorder": None,
                    },
                    "input_activations": None,
                    "output_activations": None,
                }
            },
            "ignore": [r".*self_attn.*", r".*shared_experts.*",
                       r".*mlp\.(gate|up|gate_up|down)_proj.*", r".*lm_head.*",
                       r".*vision_tower.*", r".*mm_projector.*"],
            "kv_cache_scheme": None,
            "sparsity_config": {},
        },
    }
    if p.get("no_quant_config"):
        # A full-precision save: nothing is quantized, so there is no quantization_config.
        del text["quantization_config"]
        text["torch_dtype"] = "float32"
    return {
        "coli_fixture": FIXTURE_LABEL,
        "architectures": ["KimiK3ForConditionalGeneration"],
        "model_type": "kimi_k3",
        "auto_map": {
            "AutoConfig": "configuration_kimi_k3.KimiK3Config",
            "AutoModel": "modeling_kimi_k3.KimiK3ForConditionalGeneration",
            "AutoModelForCausalLM": "modeling_kimi_k3.KimiK3ForConditionalGeneration",
        },
        "bos_token_id": base,
        "eos_token_id": base + 2,
        "pad_token_id": base + 255,
        "media_placeholder_token_id": base + 21,
        "image_placeholder": "<|kimi_image_placeholder|>",
        "ignore_index": -100,
        "dtype": "float32" if p.get("all_f32") else "bfloat16",
        "tie_word_embeddings": False,
        "text_config": text,
        "vision_config": {"model_type": "kimi_k3_vision", "hidden_size": 16,
                          "num_hidden_layers": 1, "patch_size": 14,
                          "projector_output_size": p["hidden"]},
    }


# ---------------------------------------------------------------------------------------------
# Tensors


def layer_tensors(g, p, i, is_mla, prefix, shared_router=None):
    """Non-expert tensors of decoder layer i (spec §2.3), as (list of Tensor)."""
    D = p["hidden"]
    P = f"{prefix}model.layers.{i}"
    full = p.get("f32_full", False)

    def f32(name, values):
        return f32_tensor(name, values, full)

    def dense(name, values):
        return dense_tensor(p, name, values)

    t = [
        dense(f"{P}.input_layernorm.weight", g.norm_w(D)),
        dense(f"{P}.post_attention_layernorm.weight", g.norm_w(D)),
        dense(f"{P}.self_attention_res_norm.weight", g.norm_w(D)),
        dense(f"{P}.self_attention_res_proj.weight", g.normal((1, D), RES_GAIN / np.sqrt(D))),
        dense(f"{P}.mlp_res_norm.weight", g.norm_w(D)),
        dense(f"{P}.mlp_res_proj.weight", g.normal((1, D), RES_GAIN / np.sqrt(D))),
    ]
    A = f"{P}.self_attn"
    if is_mla:
        H, n, x, v = p["mla_heads"], p["nope"], p["extra"], p["v_dim"]
        qr, kvr = p["q_lora"], p["kv_lora"]
        # Latent rows small (mean square ~2.6e-4 at D=64) so the latent-norm epsilon
        # (1e-6 vendor vs 1e-5 production, spec §3.9) changes the output visibly.
        kva = np.concatenate([g.dense(kvr, D, 0.016, lazy=False), g.dense(x, D, 1.0, lazy=False)])
        t += [
            dense(f"{A}.q_a_proj.weight", g.dense(qr, D, 0.016)),
            dense(f"{A}.q_a_layernorm.weight", g.norm_w(qr)),
            dense(f"{A}.q_b_proj.weight", g.dense(H * (n + x), qr)),
            dense(f"{A}.kv_a_proj_with_mqa.weight", kva),
            dense(f"{A}.kv_a_layernorm.weight", g.norm_w(kvr)),
            dense(f"{A}.kv_b_proj.weight", g.dense(H * (n + v), kvr)),
            dense(f"{A}.g_proj.weight", g.dense(H * v, D)),
            dense(f"{A}.o_proj.weight", g.dense(D, H * v, OUT_GAIN)),
        ]
    else:
        H, d, r, K = p["kda_heads"], p["kda_head_dim"], p["kda_rank"], p["conv"]
        C = H * d
        a_log = np.zeros(p["a_log_len"])
        a_log[:H] = np.log(g.rng.uniform(1.0, 16.0, H))  # per head; padding stays exactly 0
        t += [
            dense(f"{A}.q_proj.weight", g.dense(C, D)),
            dense(f"{A}.k_proj.weight", g.dense(C, D)),
            dense(f"{A}.v_proj.weight", g.dense(C, D)),
            f32(f"{A}.q_conv1d.weight", g.normal((C, 1, K), 0.5)),
            f32(f"{A}.k_conv1d.weight", g.normal((C, 1, K), 0.5)),
            f32(f"{A}.v_conv1d.weight", g.normal((C, 1, K), 0.5)),
            dense(f"{A}.f_a_proj.weight", g.dense(r, D)),
            dense(f"{A}.f_b_proj.weight", g.dense(C, r)),
            dense(f"{A}.b_proj.weight", g.dense(H, D)),
            f32(f"{A}.A_log", a_log),
            f32(f"{A}.dt_bias", g.normal(C, 0.5)),
            f32(f"{A}.o_norm.weight", g.norm_w(d)),
            dense(f"{A}.g_proj.weight", g.dense(C, D)),
            dense(f"{A}.o_proj.weight", g.dense(D, C, OUT_GAIN)),
        ]
    if i == 0:
        I = p["dense_inter"]
        M = f"{P}.mlp"
        t += [
            dense(f"{M}.gate_proj.weight", g.dense(I, D)),
            dense(f"{M}.up_proj.weight", g.dense(I, D)),
            dense(f"{M}.down_proj.weight", g.dense(D, I, OUT_GAIN)),
        ]
    else:
        E, lat, S = p["experts"], p["latent"], p["shared"] * p["moe_inter"]
        M = f"{P}.block_sparse_moe"
        if p["ties"]:
            router, bias = tie_router(g, E, D)
        else:
            router, bias = g.dense(E, D, 2.0), g.normal(E, 0.05)
        t += [
            dense(f"{M}.gate.weight", router),
            f32(f"{M}.gate.e_score_correction_bias", bias),
            dense(f"{M}.routed_expert_down_proj.weight", g.dense(lat, D)),
            dense(f"{M}.routed_expert_norm.weight", g.norm_w(lat)),
            dense(f"{M}.routed_expert_up_proj.weight", g.dense(D, lat, OUT_GAIN)),
            dense(f"{M}.shared_experts.gate_proj.weight", g.dense(S, D)),
            dense(f"{M}.shared_experts.up_proj.weight", g.dense(S, D)),
            dense(f"{M}.shared_experts.down_proj.weight", g.dense(D, S, OUT_GAIN)),
        ]
    return t


# Router rows that are exact copies (so sigmoid scores tie exactly for every token) and biases.
TIE_GROUPS = [(0, 3, 4), (1, 6)]
BIAS_UP, BIAS_DOWN = 7, 5


def tie_router(g, E, D):
    """tiny-ties router: rows 3 and 4 copy row 0, row 6 copies row 1 (equal biases inside each
    group, so s + bias ties exactly and the lowest index must win at the top-k boundary);
    expert BIAS_UP gets +0.25 and BIAS_DOWN -0.25, which changes selections (bias picks only)."""
    router = g.dense(E, D, 2.0, lazy=False)
    bias = np.zeros(E)
    for grp in TIE_GROUPS:
        for e in grp[1:]:
            router[e] = router[grp[0]]
    bias[BIAS_UP], bias[BIAS_DOWN] = 0.25, -0.25
    return router, bias


def expert_tensors(g, p, prefix, i, e):
    """The six tensors of one routed expert in the on-disk order (spec §2.4). Data is generated
    when written, so a real-size shard is never held in memory."""
    lat, inter = p["latent"], p["moe_inter"]
    E = f"{prefix}model.layers.{i}.block_sparse_moe.experts.{e}"
    if p.get("experts_f32"):
        # Unquantized experts (spec §9.8): w1 = gate [inter, latent], w2 = down [latent, inter],
        # w3 = up [inter, latent], F32 with full mantissas, in that order.
        return [f32_tensor(f"{E}.w1.weight", g.dense(inter, lat), full=True),
                f32_tensor(f"{E}.w2.weight", g.dense(lat, inter), full=True),
                f32_tensor(f"{E}.w3.weight", g.dense(inter, lat), full=True)]
    out = []
    for w, (rows, cols) in (("w1", (inter, lat)), ("w2", (lat, inter)), ("w3", (inter, lat))):
        cache = {}

        def packed(rows=rows, cols=cols, cache=cache):
            cache["pair"] = g.mxfp4(rows, cols)
            return cache["pair"][0].tobytes()

        def scale(cache=cache):
            return cache.pop("pair")[1].tobytes()

        out.append(Tensor(f"{E}.{w}.weight_packed", "U8", (rows, cols // 2), packed))
        out.append(Tensor(f"{E}.{w}.weight_scale", "U8", (rows, cols // 32), scale))
    return out


def global_tensors(g, p, prefix, vocab):
    D = p["hidden"]

    def dense(name, values):
        return dense_tensor(p, name, values)

    return [
        dense(f"{prefix}model.embed_tokens.weight", g.normal((vocab, D), 1.0)),
        dense(f"{prefix}lm_head.weight", g.dense(vocab, D)),
        dense(f"{prefix}model.norm.weight", g.norm_w(D)),
        dense(f"{prefix}model.output_attn_res_norm.weight", g.norm_w(D)),
        dense(f"{prefix}model.output_attn_res_proj.weight",
                    g.normal((1, D), RES_GAIN / np.sqrt(D))),
    ]


def vision_shards(g, p):
    """Two small dummy vision shards (names as in the real checkpoint's vision part)."""
    D = p["hidden"]
    proj = [
        bf16_tensor("mm_projector.pre_norm.weight", g.norm_w(64)),
        bf16_tensor("mm_projector.proj.0.weight", g.dense(64, 64)),
        bf16_tensor("mm_projector.proj.2.weight", g.dense(D, 64)),
    ]
    tower = [
        bf16_tensor("vision_tower.patch_embed.proj.weight", g.normal((16, 3, 14, 14), 0.05)),
        bf16_tensor("vision_tower.encoder.blocks.0.wqkv.weight", g.dense(48, 16)),
        bf16_tensor("vision_tower.encoder.blocks.0.wo.weight", g.dense(16, 16)),
        f32_tensor("vision_tower.encoder.final_layernorm.weight", g.norm_w(16)),
    ]
    return [proj, tower]


# ---------------------------------------------------------------------------------------------


def build(out_dir, preset, seed=1, prefix=True, moe_layers=None, experts=None, top_k=None,
          log=print):
    p = dict(PRESETS[preset])
    if moe_layers is not None:
        p["layers"] = moe_layers + 1
    if experts is not None:
        p["experts"] = experts
    if top_k is not None:
        p["top_k"] = top_k
    if p["top_k"] > p["experts"]:
        raise ValueError(f"top-k {p['top_k']} > experts {p['experts']}")
    pre = "language_model." if prefix else ""
    g = Gen(seed)
    t0 = time.time()

    parent = os.path.dirname(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(out_dir)}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)

    vocab_list = train_bpe(TRAIN_TEXT, p["merges"])
    base = write_tokenizer(tmp, vocab_list)
    config = make_config(p, base)
    vocab = base + 256
    full = set(x - 1 for x in config["text_config"]["linear_attn_config"]["full_attn_layers"])

    L = p["layers"]
    nshards = L + 3
    names = [f"model-{k:05d}-of-{nshards:06d}.safetensors" for k in range(1, nshards + 1)]
    weight_map, total = {}, 0
    expert_order = {}
    for i in range(L):
        tensors = layer_tensors(g, p, i, i in full, pre)
        if i > 0:
            order = [int(e) for e in g.rng.permutation(p["experts"])]
            expert_order[i] = order
            per_expert = [expert_tensors(g, p, pre, i, e) for e in order]
            if i in p.get("matrix_major_layers", []):
                # Matrix-major: every expert's first tensor, then every second, ...
                tensors += [ts[k] for k in range(len(per_expert[0])) for ts in per_expert]
            else:
                for ts in per_expert:
                    tensors += ts
        total += write_safetensors(os.path.join(tmp, names[i]), tensors)
        for t in tensors:
            weight_map[t.name] = names[i]
        if log and p["latent"] >= 1024:  # the big presets report progress per shard
            log(f"  layer {i}: {names[i]} ({time.time() - t0:.1f} s)")
    extra = [global_tensors(g, p, pre, vocab)] + vision_shards(g, p)
    for k, tensors in enumerate(extra):
        name = names[L + k]
        total += write_safetensors(os.path.join(tmp, name), tensors)
        for t in tensors:
            weight_map[t.name] = name

    with open(os.path.join(tmp, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total},
                   "weight_map": dict(sorted(weight_map.items()))}, f, indent=2)
    with open(os.path.join(tmp, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": base, "eos_token_id": base + 2, "do_sample": True,
                   "temperature": 1.0, "top_p": 1.0}, f, indent=2)
    with open(os.path.join(tmp, "README.txt"), "w") as f:
        f.write(
            f"RANDOM WEIGHTS - NOT A REAL MODEL.\n\n"
            f"A Kimi K3-shaped test fixture written by tools/k3/make_fixture.py "
            f"(preset {preset}, seed {seed}). It has the real file layout, names, dtypes and "
            f"{'F32 (unquantized experts)' if p.get('experts_f32') else 'MXFP4'} packing with small "
            f"widths; its outputs are meaningless text.\n"
            f"Expert order per shard (layer: ids in file order):\n" +
            "".join(f"  {i}: {' '.join(map(str, o))}\n" for i, o in expert_order.items()))
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(config, f, indent=2)

    out_abs = os.path.abspath(out_dir)
    old = None
    if os.path.exists(out_abs):
        old = os.path.join(parent, f".{os.path.basename(out_dir)}.old-{os.getpid()}")
        os.rename(out_abs, old)
    os.rename(tmp, out_abs)
    if old:
        shutil.rmtree(old, ignore_errors=True)
    if log:
        log(f"wrote {out_dir}: preset {preset}, {L} layers, {nshards} shards, "
            f"{total / 1e6:.1f} MB of tensors, {time.time() - t0:.1f} s")
    return config


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-prefix", action="store_true",
                    help="drop the 'language_model.' prefix (flattened container)")
    ap.add_argument("--moe-layers", type=int, help="number of MoE layers (layers = this + 1)")
    ap.add_argument("--experts", type=int, help="routed experts per MoE layer")
    ap.add_argument("--top-k", type=int, help="experts per token")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args(argv)
    if a.moe_layers is not None and a.moe_layers < 1:
        ap.error("--moe-layers must be >= 1")
    if a.experts is not None and a.experts < 1:
        ap.error("--experts must be >= 1")
    try:
        build(a.out_dir, a.preset, a.seed, not a.no_prefix, a.moe_layers, a.experts, a.top_k,
              log=None if a.quiet else print)
    except (OSError, ValueError, RuntimeError) as e:
        print(f"make_fixture: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
