#!/usr/bin/env node
// Encode throughput of coli against npm tiktoken (Rust core as WASM) on the same corpus, in
// the same run, with the Kimi-shaped vocabulary (and o200k / cl100k with --all).
//
//   node tests/node/tiktoken/bench.js --coli build/bin/coli --work build/fixtures/tiktoken [--all]
//
// The corpus (about 2 MB, written to <work>/corpus.txt) mixes this repository's source and
// documents with the cross-check's multilingual strings. tiktoken encodes it with
// encode_ordinary, best of several runs for at least --min-seconds; coli runs
// `coli bench tokenizer --json` on the same file. The ids are also compared once
// (`coli tokenize --no-slicing`), so the two sides are known to do the same work.
"use strict";

const { execFileSync } = require("child_process");
const fs = require("fs");
const path = require("path");
const { buildVocabs, loadTiktoken } = require("./vocabs");
const Tiktoken = loadTiktoken();
const { allStrings } = require("./strings");

function parseArgs() {
  const args = { coli: null, work: null, source: path.resolve(__dirname, "../../.."), all: false, minSeconds: 2 };
  for (let i = 2; i < process.argv.length; i++) {
    const a = process.argv[i];
    if (a === "--coli") args.coli = process.argv[++i];
    else if (a === "--work") args.work = process.argv[++i];
    else if (a === "--source") args.source = process.argv[++i];
    else if (a === "--all") args.all = true;
    else if (a === "--min-seconds") args.minSeconds = Number(process.argv[++i]);
    else throw new Error(`unknown argument ${a}`);
  }
  if (!args.coli || !args.work) throw new Error("usage: bench.js --coli PATH --work DIR [--all]");
  return args;
}

function collectFiles(dir, exts, out) {
  for (const entry of fs.readdirSync(dir, { withFileTypes: true }).sort((a, b) => (a.name < b.name ? -1 : 1))) {
    if (entry.name.startsWith(".") || entry.name === "node_modules" || entry.name.startsWith("build")) continue;
    const p = path.join(dir, entry.name);
    if (entry.isDirectory()) collectFiles(p, exts, out);
    else if (exts.some((e) => entry.name.endsWith(e))) out.push(p);
  }
  return out;
}

function buildCorpus(source, target) {
  const files = collectFiles(source, [".cc", ".h", ".md", ".py", ".js", ".cmake", ".txt"], []);
  const strings = allStrings().filter((s) => s.length < 1000).join("\n");
  let corpus = "";
  let i = 0;
  while (corpus.length < target && files.length) {
    corpus += fs.readFileSync(files[i % files.length], "utf8") + "\n" + strings + "\n";
    i++;
  }
  return corpus.slice(0, target);
}

function timeBest(minSeconds, fn) {
  let best = Infinity;
  const start = process.hrtime.bigint();
  for (let runs = 0; runs < 3 || Number(process.hrtime.bigint() - start) / 1e9 < minSeconds; runs++) {
    const t0 = process.hrtime.bigint();
    fn();
    best = Math.min(best, Number(process.hrtime.bigint() - t0) / 1e9);
  }
  return best;
}

function main() {
  const args = parseArgs();
  const vocabs = buildVocabs(args.work, args.source);
  const corpus = buildCorpus(args.source, 2_000_000);
  const corpusPath = path.join(args.work, "corpus.txt");
  fs.writeFileSync(corpusPath, corpus);
  const bytes = Buffer.byteLength(corpus, "utf8");
  const names = args.all ? ["kimi", "o200k", "cl100k"] : ["kimi"];
  const results = [];
  for (const name of names) {
    const v = vocabs[name];
    const enc = new Tiktoken(v.ranks, v.specials, v.pattern);
    let want = null;
    const tiktokenS = timeBest(args.minSeconds, () => { want = enc.encode_ordinary(corpus); });
    const got = JSON.parse(execFileSync(args.coli, ["tokenize", "--tokenizer", v.dir, "--no-slicing"],
      { input: corpus, maxBuffer: 1 << 30 }).toString());
    const same = got.length === want.length && got.every((id, k) => id === want[k]);
    const bench = JSON.parse(execFileSync(args.coli,
      ["bench", "tokenizer", "--json", "--tokenizer", v.dir, "--corpus", corpusPath,
       "--min-seconds", String(args.minSeconds)]).toString());
    enc.free();
    const tiktokenMBs = bytes / 1e6 / tiktokenS;
    const r = {
      vocabulary: name,
      corpus_bytes: bytes,
      tokens: want.length,
      ids_identical: same,
      tiktoken_mb_per_s: +tiktokenMBs.toFixed(3),
      coli_mb_per_s: bench.encode_mb_per_s,
      ratio: +(bench.encode_mb_per_s / tiktokenMBs).toFixed(3),
      coli_repeated_char_1mib_s: bench.repeated_char_1mib_s,
      coli_long_word_1mib_s: bench.long_word_1mib_s,
      coli_load_s: bench.load_s,
    };
    results.push(r);
    console.log(`${name}: corpus ${bytes} bytes, ${want.length} tokens, ids ${same ? "identical" : "DIFFER"}; ` +
      `tiktoken ${r.tiktoken_mb_per_s} MB/s, coli ${r.coli_mb_per_s} MB/s, ratio ${r.ratio}x; ` +
      `coli 1 MiB 'a' ${r.coli_repeated_char_1mib_s} s, 1 MiB word ${r.coli_long_word_1mib_s} s`);
  }
  console.log(JSON.stringify(results));
  process.exit(results.every((r) => r.ids_identical) ? 0 : 1);
}

main();
