// Throughput of rlx serve through HTTP: BATCH concurrent /v1/completions requests, each a
// random token-id prompt of PROMPT tokens and N samples of NEW tokens (ignore_eos), timed
// from the first request sent to the last answer; ITERS rounds. Prints one JSON line.
//   node bench_serve.js BASE_URL MODEL VOCAB BATCH PROMPT NEW N ITERS [STREAM]
'use strict';
const [baseURL, model, vocab, batch, promptLen, newTokens, n, iters, stream] = process.argv.slice(2);
let state = 0x2545f491;
const rand = (k) => {  // xorshift32: the same prompts every run
  state ^= state << 13; state >>>= 0; state ^= state >>> 17; state ^= state << 5; state >>>= 0;
  return state % k;
};
const prompts = Array.from({ length: Number(batch) }, () => Array.from({ length: Number(promptLen) }, () => rand(Number(vocab))));

async function one(prompt, seed) {
  const body = { model, prompt, max_tokens: Number(newTokens), n: Number(n), temperature: 1.0, ignore_eos: true, seed };
  if (stream === 'stream') body.stream = true;
  const r = await fetch(`${baseURL}/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  const text = await r.text();
  if (r.status !== 200) throw new Error(`HTTP ${r.status}: ${text}`);
  if (stream === 'stream') return Number(newTokens) * Number(n);
  return JSON.parse(text).usage.completion_tokens;
}

(async () => {
  await one(prompts[0], 0);  // warm-up
  let tokens = 0, seconds = 0;
  for (let it = 0; it < Number(iters); it++) {
    const t0 = process.hrtime.bigint();
    const counts = await Promise.all(prompts.map((p, i) => one(p, it * 1000 + i)));
    seconds += Number(process.hrtime.bigint() - t0) / 1e9;
    tokens += counts.reduce((a, b) => a + b, 0);
  }
  console.log(JSON.stringify({ bench: 'serve', batch: Number(batch), prompt: Number(promptLen), new: Number(newTokens), n: Number(n),
                               iters: Number(iters), stream: stream === 'stream', tokens_per_s: tokens / seconds }));
})().catch((e) => { console.error(e); process.exit(1); });
