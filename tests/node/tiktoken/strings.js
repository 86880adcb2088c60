// Adversarial strings for the tokenizer cross-check: every place where a split pattern, the
// Han/letter classes, case folding or BPE ties could go wrong. Only characters assigned in
// Unicode 14 (PCRE2 10.42's tables) appear, so both sides agree on every property.
"use strict";

const FIXED = [
  // Code.
  "def f(x):\n    return x**2 + 1\n",
  "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}\n",
  "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); }",
  "const re = /\\p{L}+/gu; // comment\n",
  "if x != y && z >= 3 || !w:\n    pass",
  "SELECT * FROM users WHERE id = 'abc' AND name LIKE '%x%';",
  "    indented\n        more\n",
  "fn main() -> Result<(), Box<dyn Error>> { Ok(()) }",
  "<div class=\"a\"><span>x</span></div>",
  "a_b_c __init__ __dunder__ snake_case_name",
  // Contractions in every case.
  "I'm you're he's it's we've they'll I'd",
  "I'M YOU'RE HE'S IT'S WE'VE THEY'LL I'D",
  "i'M yOu'Re He'S iT's We'vE tHeY'lL i'D",
  "don't DON'T Don'T dOn't",
  "'s 't 're 've 'm 'll 'd 'S 'T 'RE 'VE 'M 'LL 'D",
  "x'ſ y'ſt the long s folds to s",
  "rock'n'roll o'clock y'all ma'am",
  "'''quoted''' \"double\" 'single'",
  "’s curly apostrophe isn’t ASCII",
  // Digits.
  "1234567890",
  "3.14159265358979",
  "1,000,000 and 12,345.67",
  "0x1F600 0b1010 1e-10",
  "٣٤٥٦٧ Arabic-Indic digits",
  "১২৩৪ Bengali digits",
  "１２３４５ fullwidth digits",
  "Ⅻ ⅻ Roman numerals ½ ¾ ²³",
  "Year2024Q3 v1.2.3-rc4",
  // Punctuation runs with newlines.
  "!!!\n\n???",
  "...\n",
  "--\r\n--",
  "}}\n\n\n{{",
  "///\n///",
  "a//b /// c",
  "?!?!?!\n",
  "«quotes» „German“ 「Japanese」",
  "---\n***\n___",
  // Whitespace: CRLF, tabs, trailing spaces, NEL, NBSP.
  "a\r\nb\r\n\r\nc",
  "\r\n\r\n",
  "\r\r\n\n",
  "\tx\t\ty\t",
  "end   ",
  "   ",
  "\n   \n",
  "a  \n b",
  "  leading spaces",
  "word \t\n mixed",
  "a\u0085b NEL",
  "a\u00a0b NBSP",
  "a\u2028b\u2029c",
  "a\u000bb\u000cc",
  "\u3000ideographic\u3000space",
  "x \u3000 y",
  // Han mixed with Latin and digits, no spaces.
  "我爱AI2024年",
  "GPT4是OpenAI的模型",
  "中文English混合123测试",
  "在2024年1月1日发布v2版本",
  "你好，世界！",
  "数学公式：E=mc²，其中c是光速。",
  "这是一个很长的中文句子，用来测试汉字连续序列的切分是否正确。",
  // Kana + kanji.
  "東京タワーへ行きました",
  "ひらがなカタカナ漢字",
  "ｶﾀｶﾅ halfwidth",
  "ラーメン二郎",
  "〆切は明日です",
  "々〇〆ー",
  "日本語のテキストとEnglishの混在",
  // Han edge characters: script Han vs Script_Extensions Han, marks, radicals, supplementary.
  "中\u302a文",
  "a\u302ab",
  "⺀⻳⼀ radicals",
  "𠀀𠀁 supplementary CJK",
  "a𠀀b",
  "Ab中Cd",
  "ABC中DEF",
  "abc\u0300中",
  // Korean, Arabic, Devanagari, Thai, others.
  "안녕하세요 세계",
  "한국어텍스트English",
  "مرحبا بالعالم",
  "السلام عليكم ١٢٣",
  "नमस्ते दुनिया",
  "हिन्दी में लिखा गया",
  "สวัสดีชาวโลก",
  "ภาษาไทยไม่มีช่องว่าง",
  "ΑΒΓ αβγ Ελληνικά",
  "ПРИВЕТ мир Привет",
  "עברית שלום",
  "ქართული ენა",
  // Emoji with ZWJ and skin tones.
  "👨‍👩‍👧‍👦",
  "👍🏽👍🏿",
  "🏳️‍🌈 flag",
  "I ❤️ NY 🗽",
  "😀😃😄😁",
  "👩🏽‍💻 coding",
  "emoji🙂in😀words",
  // Combining marks.
  "e\u0301 cafe\u0301",
  "a\u0308\u0304",
  "\u0301leading mark",
  "Z\u0351\u0328a\u0363l\u0358g\u0307o",
  "ǅungla ǈ ǋ titlecase",
  "Ａｂｃ fullwidth letters",
  // camelCase and casing.
  "getElementById",
  "XMLHttpRequest",
  "parseHTTPResponse",
  "iPhone iPad macOS",
  "HeLLo WoRLD",
  "ALLCAPS's ALLCAPS'S",
  "abcDEF ABCdef",
  "snake_CaseMixed",
  // URLs and JSON.
  "https://example.com/path/to?q=1&r=2#frag",
  "http://localhost:8080/api/v1/users/42",
  "mailto:user@example.com",
  "{\"key\": [1, 2.5, \"x\"], \"n\": null, \"b\": true}",
  "{\"nested\":{\"a\":[{\"b\":\"c\"}]}}",
  "[{\"role\":\"user\",\"content\":\"hi\"}]",
  // Literal special-token text.
  "<|open|>user<|sep|>hello<|close|>",
  "[BOS]hello[EOS]",
  "<|end_of_msg|>",
  "<|reserved_token_163700|>",
  "<|im_end|><|im_user|>",
  "<|endoftext|> and <|fim_prefix|>",
  "<|open|",
  "<|open|><|open|>",
  "text<|sep|>text",
  "[PAD][UNK]",
  // Control characters and other oddities.
  "\u0000\u0001\u0002",
  "\ufeffBOM first",
  "zero\u200bwidth\u200dspace",
  "tab\u0009bell\u0007",
  "",
  " ",
  "a",
  "\n",
];

// Long runs (tiktoken's own BPE is quadratic per piece, so these stay in the thousands).
const LONG = [
  "a".repeat(3000),
  " ".repeat(1000) + "x",
  "\n".repeat(500),
  "1".repeat(1000),
  "中".repeat(2000),
  "!".repeat(2000),
  "ab".repeat(1500),
  "A".repeat(1000) + "b",
  "é".repeat(1000),
  "😀".repeat(500),
];

// Seeded random strings over a pool of interesting characters (deterministic).
function randomStrings(count, seed) {
  const pool = Array.from(
    "aAzZ'sStT mMlLdD0123456789 \t\r\n.,;!?-_/\\\"(){}[]<>|中文々〆〇ー" +
      "あアｱ한글مرحبानमस्तेสวัสดีΑβПж" +
      "\u0301\u0308\u302a\u00a0\u0085\u3000\u200d🙂👍🏽👨‍👩‍👧𠀀ǅ½",
  );
  let state = seed >>> 0;
  const next = () => {
    state = (Math.imul(state, 1664525) + 1013904223) >>> 0;
    return state;
  };
  const out = [];
  for (let i = 0; i < count; i++) {
    const len = 1 + (next() % 40);
    let s = "";
    for (let j = 0; j < len; j++) s += pool[next() % pool.length];
    out.push(s);
  }
  return out;
}

// Byte strings that are not valid UTF-8 (coli replaces per maximal subpart, like TextDecoder).
const INVALID_BYTES = [
  Buffer.from([0x61, 0xff, 0x62]),
  Buffer.from([0xe4, 0xb8, 0x78, 0x79]),
  Buffer.from([0xed, 0xa0, 0x80, 0x41]),
  Buffer.from([0xc0, 0x80, 0x20, 0x61]),
  Buffer.from("hello \xf0\x9f\x98", "latin1"),
  Buffer.concat([Buffer.from("中文"), Buffer.from([0x80, 0x80]), Buffer.from("abc")]),
];

function allStrings() {
  return [...FIXED, ...LONG, ...randomStrings(60, 20261129)];
}

module.exports = { allStrings, INVALID_BYTES };
