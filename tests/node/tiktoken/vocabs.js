// Builds the vocabularies the cross-check and the benchmark use, from the ranks that the npm
// `tiktoken` package itself ships, into a work folder under the build directory:
//
//   kimi/        tiktoken.model = o200k_base entries with rank < 163,584, plus a
//                tokenizer_config.json with the K3 specials at their real ids (spec §5.1);
//                no pat_str, so coli uses Kimi's split pattern (its default).
//   kimi_json/   the same vocabulary as tokenizer.json, written by
//                tools/tokenizer/tiktoken_to_tokenizer_json.py.
//   o200k/, cl100k/  the full encodings with their own pat_str in tokenizer_config.json.
//
// Each entry carries the tiktoken (reference) view of the same thing: ranks text, special
// tokens and pattern, ready for `new Tiktoken(ranks, specials, pattern)`.
"use strict";

const fs = require("fs");
const path = require("path");
const { execFileSync } = require("child_process");

// OpenAI's Tiktoken class (WASM core), or exit with the set-up step that is missing.
function loadTiktoken() {
  try {
    return require("tiktoken/lite").Tiktoken;
  } catch (e) {
    console.error(`cannot load npm 'tiktoken' (${e.message}); run 'npm ci' in ${__dirname} ` +
                  "(scripts/setup.sh does it for every tests/node folder)");
    process.exit(1);
  }
}

// Kimi's split pattern exactly as the vendor passes it to tiktoken (spec §5.2).
const KIMI_PATTERN = [
  String.raw`[\p{Han}]+`,
  String.raw`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
  String.raw`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
  String.raw`\p{N}{1,3}`,
  String.raw` ?[^\s\p{L}\p{N}]+[\r\n]*`,
  String.raw`\s*[\r\n]+`,
  String.raw`\s+(?!\S)`,
  String.raw`\s+`,
].join("|");

const KIMI_NUM_BASE = 163584;
const KIMI_RESERVED = 256;
const KIMI_NAMED = {
  163584: "[BOS]",
  163585: "[EOS]",
  163586: "<|end_of_msg|>",
  163587: "<|open|>",
  163588: "<|close|>",
  163589: "<|sep|>",
  163600: "<|kimi_image_placeholder|>",
  163601: "<|media_begin|>",
  163602: "<|media_content|>",
  163603: "<|media_end|>",
  163605: "<|media_pad|>",
  163838: "[UNK]",
  163839: "[PAD]",
};

// The npm package stores ranks as "! <offset> <b64> <b64> ...": consecutive ranks from the
// offset, a new "! n" restarting the count. Returns [base64, rank] pairs.
function parseNpmRanks(text) {
  const parts = text.split(/\s+/).filter((p) => p.length > 0);
  const out = [];
  let rank = 0;
  for (let i = 0; i < parts.length; i++) {
    if (parts[i] === "!") {
      rank = Number(parts[++i]);
      if (!Number.isInteger(rank)) throw new Error(`bad rank offset '${parts[i]}'`);
      continue;
    }
    out.push([parts[i], rank++]);
  }
  return out;
}

function loadNpmEncoding(name) {
  const file = require.resolve(`tiktoken/encoders/${name}.json`);
  const data = JSON.parse(fs.readFileSync(file, "utf8"));
  return { ranks: parseNpmRanks(data.bpe_ranks), specials: data.special_tokens, pattern: data.pat_str };
}

function ranksText(pairs) {
  return pairs.map(([b64, r]) => `${b64} ${r}`).join("\n") + "\n";
}

function addedTokensDecoder(named) {
  const out = {};
  for (const [id, content] of Object.entries(named)) {
    out[id] = { content, lstrip: false, normalized: false, rstrip: false, single_word: false, special: true };
  }
  return out;
}

function writeDir(dir, ranks, config) {
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, "tiktoken.model"), ranks);
  fs.writeFileSync(path.join(dir, "tokenizer_config.json"), JSON.stringify(config, null, 1));
}

// Returns { kimi, kimi_json, o200k, cl100k }, each { dir, ranks, specials, pattern }.
function buildVocabs(workDir, sourceDir) {
  const o200k = loadNpmEncoding("o200k_base");
  const cl100k = loadNpmEncoding("cl100k_base");

  const kimiPairs = o200k.ranks.filter(([, r]) => r < KIMI_NUM_BASE);
  if (kimiPairs.length !== KIMI_NUM_BASE) {
    throw new Error(`o200k_base has ${kimiPairs.length} entries below ${KIMI_NUM_BASE}, expected all`);
  }
  const kimiRanks = ranksText(kimiPairs);
  // tokenization_kimi.py: every id in [num_base, num_base + 256) is a special token, named from
  // added_tokens_decoder or <|reserved_token_ID|>.
  const kimiSpecials = {};
  for (let id = KIMI_NUM_BASE; id < KIMI_NUM_BASE + KIMI_RESERVED; id++) {
    kimiSpecials[KIMI_NAMED[id] || `<|reserved_token_${id}|>`] = id;
  }
  const kimiDir = path.join(workDir, "kimi");
  writeDir(kimiDir, kimiRanks, { added_tokens_decoder: addedTokensDecoder(KIMI_NAMED) });

  const kimiJsonDir = path.join(workDir, "kimi_json");
  execFileSync("/usr/bin/python3",
    [path.join(sourceDir, "tools/tokenizer/tiktoken_to_tokenizer_json.py"), kimiDir, kimiJsonDir],
    { stdio: ["ignore", "inherit", "inherit"] });

  const result = {
    kimi: { dir: kimiDir, ranks: kimiRanks, specials: kimiSpecials, pattern: KIMI_PATTERN },
    kimi_json: { dir: kimiJsonDir, ranks: kimiRanks, specials: kimiSpecials, pattern: KIMI_PATTERN },
  };
  for (const [name, enc] of [["o200k", o200k], ["cl100k", cl100k]]) {
    const ranks = ranksText(enc.ranks);
    const named = {};
    for (const [content, id] of Object.entries(enc.specials)) named[id] = content;
    const dir = path.join(workDir, name);
    // num_reserved_special_tokens 0: only the named specials (gaps between them become
    // coli reserved ids, which no test string names).
    writeDir(dir, ranks, {
      pat_str: enc.pattern,
      num_reserved_special_tokens: 0,
      added_tokens_decoder: addedTokensDecoder(named),
    });
    result[name] = { dir, ranks, specials: enc.specials, pattern: enc.pattern };
  }
  return result;
}

module.exports = { buildVocabs, loadTiktoken, KIMI_PATTERN, parseNpmRanks };
