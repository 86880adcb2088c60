#!/usr/bin/env node
// Cross-checks `coli tokenize` against OpenAI's tiktoken (npm `tiktoken`: its Rust core
// compiled to WASM) on adversarial strings, id for id.
//
//   node crosscheck.js --coli build/bin/coli --work build/fixtures/tiktoken
//
// Vocabularies (see vocabs.js): Kimi-shaped (o200k ranks < 163,584 + K3 specials, Kimi's split
// pattern with `&&`, which fancy-regex supports natively) in both tiktoken.model and
// tokenizer.json form, and the full o200k_base and cl100k_base with their own patterns.
// For each: every string with special tokens off (tiktoken encode_ordinary) and on
// (encode(text, "all")), invalid UTF-8 byte strings (tiktoken gets TextDecoder's replacement),
// and a decode round trip. Exit status 1 with a per-string diff on any mismatch.
"use strict";

const { execFileSync } = require("child_process");
const path = require("path");
const { buildVocabs, loadTiktoken } = require("./vocabs");
const Tiktoken = loadTiktoken();
const { allStrings, INVALID_BYTES } = require("./strings");

function parseArgs() {
  const args = { coli: null, work: null, source: path.resolve(__dirname, "../../..") };
  for (let i = 2; i < process.argv.length; i++) {
    const a = process.argv[i];
    if (a === "--coli") args.coli = process.argv[++i];
    else if (a === "--work") args.work = process.argv[++i];
    else if (a === "--source") args.source = process.argv[++i];
    else throw new Error(`unknown argument ${a}`);
  }
  if (!args.coli || !args.work) throw new Error("usage: crosscheck.js --coli PATH --work DIR");
  return args;
}

function runColi(coli, argv, input) {
  return execFileSync(coli, argv, { input, maxBuffer: 1 << 30, stdio: ["pipe", "pipe", "inherit"] });
}

// One coli process for many strings: --jsonl (one JSON string per line in, one array out).
function coliEncodeMany(coli, dir, texts, allowSpecial) {
  const argv = ["tokenize", "--tokenizer", dir, "--jsonl"];
  if (allowSpecial) argv.push("--allow-special");
  const input = texts.map((t) => JSON.stringify(t)).join("\n") + "\n";
  const lines = runColi(coli, argv, input).toString("utf8").split("\n").filter((l) => l.length);
  if (lines.length !== texts.length) {
    throw new Error(`coli printed ${lines.length} lines for ${texts.length} strings`);
  }
  return lines.map((l) => JSON.parse(l));
}

function coliEncodeBytes(coli, dir, bytes, allowSpecial) {
  const argv = ["tokenize", "--tokenizer", dir];
  if (allowSpecial) argv.push("--allow-special");
  return JSON.parse(runColi(coli, argv, bytes).toString("utf8"));
}

function show(s) {
  const j = JSON.stringify(s);
  return j.length > 160 ? j.slice(0, 160) + `... (${s.length} UTF-16 units)` : j;
}

function describeDiff(enc, label, text, want, got) {
  let i = 0;
  while (i < want.length && i < got.length && want[i] === got[i]) i++;
  const piece = (ids) =>
    ids
      .slice(i, i + 6)
      .map((id) => {
        let bytes;
        try {
          bytes = Buffer.from(enc.decode_single_token_bytes(id));
        } catch (e) {
          bytes = Buffer.from("?");
        }
        return `${id}:${JSON.stringify(bytes.toString("utf8"))}`;
      })
      .join(" ");
  return (
    `  [${label}] ${show(text)}\n` +
    `    first difference at token ${i} (tiktoken ${want.length} tokens, coli ${got.length})\n` +
    `    tiktoken: ${piece(want)}\n` +
    `    coli:     ${piece(got)}`
  );
}

function sameIds(a, b) {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

function main() {
  const args = parseArgs();
  const t0 = Date.now();
  const vocabs = buildVocabs(args.work, args.source);
  const strings = allStrings();
  console.log(`${strings.length} strings + ${INVALID_BYTES.length} invalid byte strings; ` +
              `vocabularies built in ${Date.now() - t0} ms`);
  let failures = 0;
  let checks = 0;
  for (const [name, v] of Object.entries(vocabs)) {
    const enc = new Tiktoken(v.ranks, v.specials, v.pattern);
    const report = [];
    for (const allowSpecial of [false, true]) {
      const got = coliEncodeMany(args.coli, v.dir, strings, allowSpecial);
      strings.forEach((text, k) => {
        const want = Array.from(allowSpecial ? enc.encode(text, "all") : enc.encode_ordinary(text));
        checks++;
        if (!sameIds(want, got[k])) {
          report.push(describeDiff(enc, allowSpecial ? "special on" : "special off", text, want, got[k]));
        }
      });
    }
    // Raw stdin path, valid and invalid UTF-8.
    const decoder = new TextDecoder("utf-8");
    const rawCases = [...INVALID_BYTES, Buffer.from(strings[0]), Buffer.from("<|open|>x[BOS]")];
    for (const bytes of rawCases) {
      const want = Array.from(enc.encode_ordinary(decoder.decode(bytes)));
      const got = coliEncodeBytes(args.coli, v.dir, bytes, false);
      checks++;
      if (!sameIds(want, got)) report.push(describeDiff(enc, "raw bytes", bytes.toString("latin1"), want, got));
    }
    // Decode round trip: all strings' ids (special tokens off) decode to the strings' bytes.
    const ids = strings.flatMap((t) => Array.from(enc.encode_ordinary(t)));
    const decoded = runColi(args.coli, ["tokenize", "--tokenizer", v.dir, "--decode"], JSON.stringify(ids));
    const expected = Buffer.from(strings.join(""), "utf8");
    checks++;
    if (!decoded.equals(expected)) {
      report.push(`  [decode] round trip of ${ids.length} ids: ${decoded.length} bytes, expected ${expected.length}`);
    }
    enc.free();
    if (report.length) {
      failures += report.length;
      console.log(`FAIL ${name}: ${report.length} mismatches`);
      console.log(report.join("\n"));
    } else {
      console.log(`ok   ${name}: ${strings.length * 2 + rawCases.length + 1} checks identical to tiktoken`);
    }
  }
  console.log(`${checks} checks, ${failures} failures, ${Date.now() - t0} ms`);
  process.exit(failures ? 1 : 0);
}

main();
