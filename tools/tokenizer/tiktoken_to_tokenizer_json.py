#!/usr/bin/python3
"""Writes a Hugging Face tokenizer.json for a tiktoken vocabulary (stdlib only).

    tiktoken_to_tokenizer_json.py MODEL_DIR OUT_DIR

MODEL_DIR holds tiktoken.model (lines "<base64 bytes> <rank>") and optionally
tokenizer_config.json (added_tokens_decoder, and coli's optional pat_str /
num_reserved_special_tokens). OUT_DIR receives tokenizer.json and a copy of
tokenizer_config.json, so `Tokenizer::LoadDir(OUT_DIR)` reads the JSON form.

The result is what colibri's k3_tokenizer.py describes (spec §5.3): the vocabulary keyed by
GPT-2 byte-to-unicode strings with id = rank, EMPTY merges (which tells a loader to run
tiktoken's rank-BPE: deriving merges from ranks is lossy), every id from the base size up to
base + reserved as an added special token (named from the config, otherwise
<|reserved_token_ID|>), and a Split(Isolated) + ByteLevel(use_regex=false) pre-tokenizer
with the family's split regex (Kimi's, spec §5.2, unless the config names pat_str).
"""

import base64
import binascii
import json
import os
import shutil
import sys

KIMI_PATTERN = "|".join([
    r"[\p{Han}]+",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"
    r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"
    r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
])

DEFAULT_RESERVED = 256


def bytes_to_unicode():
    """GPT-2's byte -> printable character table."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) +
                 list(range(0xAE, 0xFF + 1)))
    table = {}
    n = 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + n)
            n += 1
    return table


def fail(message):
    sys.stderr.write("tiktoken_to_tokenizer_json: %s\n" % message)
    sys.exit(1)


def read_ranks(path):
    ranks = {}
    seen_bytes = {}
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, 1):
            line = raw.rstrip(b"\r\n")
            if not line:
                continue
            parts = line.split(b" ")
            if len(parts) != 2:
                fail("%s line %d: expected '<base64> <rank>'" % (path, line_no))
            try:
                token = base64.b64decode(parts[0], validate=True)
                rank = int(parts[1])
            except (binascii.Error, ValueError) as e:
                fail("%s line %d: %s" % (path, line_no, e))
            if rank in ranks:
                fail("%s line %d: duplicate rank %d" % (path, line_no, rank))
            if token in seen_bytes:
                fail("%s line %d: duplicate token bytes (rank %d)" % (path, line_no,
                                                                       seen_bytes[token]))
            ranks[rank] = token
            seen_bytes[token] = rank
    if sorted(ranks) != list(range(len(ranks))):
        fail("%s: ranks must be 0..N-1 without gaps" % path)
    return ranks


def main(argv):
    if len(argv) != 3:
        sys.stderr.write(__doc__)
        return 2
    model_dir, out_dir = argv[1], argv[2]
    ranks = read_ranks(os.path.join(model_dir, "tiktoken.model"))
    config_path = os.path.join(model_dir, "tokenizer_config.json")
    config = {}
    if os.path.exists(config_path):
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
    pattern = config.get("pat_str") or KIMI_PATTERN
    reserved = config.get("num_reserved_special_tokens", DEFAULT_RESERVED)
    named = {int(k): v for k, v in config.get("added_tokens_decoder", {}).items()}

    byte_map = bytes_to_unicode()
    vocab = {"".join(byte_map[b] for b in token): rank for rank, token in sorted(ranks.items())}
    num_base = len(ranks)
    end = max([num_base + reserved] + [i + 1 for i in named])
    added = []
    for i in range(num_base, end):
        entry = named.get(i, {})
        added.append({
            "id": i,
            "content": entry.get("content", "<|reserved_token_%d|>" % i),
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": entry.get("special", True),
        })
    doc = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated",
                 "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                 "use_regex": False},
            ],
        },
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [],
        },
    }
    os.makedirs(out_dir, exist_ok=True)
    tmp = os.path.join(out_dir, "tokenizer.json.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False)
    os.replace(tmp, os.path.join(out_dir, "tokenizer.json"))
    if os.path.exists(config_path):
        shutil.copyfile(config_path, os.path.join(out_dir, "tokenizer_config.json"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
