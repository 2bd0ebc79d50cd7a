// rlx serve driven by the real OpenAI Node SDK (npm `openai`) and by raw HTTP for what the
// SDK will not send. Exits non-zero on the first failed check.
//   node openai_sdk_test.js NODE_MODULES_DIR BASE_URL MODEL MAX_BODY_BYTES
'use strict';
const http = require('http');
const path = require('path');
const assert = require('assert/strict');
const [modulesDir, baseURL, model, maxBody] = process.argv.slice(2);
const mod = require(path.join(modulesDir, 'openai'));
const OpenAI = mod.OpenAI || mod.default || mod;
const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
const messages = [{ role: 'system', content: 'You are terse.' }, { role: 'user', content: 'Count to three.' }];

let checks = 0;
async function check(name, fn) {
  try {
    await fn();
    checks++;
    console.log(`ok: ${name}`);
  } catch (e) {
    console.log(`FAIL: ${name}: ${e && e.stack ? e.stack : e}`);
    process.exit(1);
  }
}

async function raw(pathname, body, headers = {}) {
  const r = await fetch(baseURL + pathname, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch (e) { /* not JSON */ }
  return { status: r.status, json, text };
}

(async () => {
  await check('models.list names the served model', async () => {
    const list = await client.models.list();
    assert.deepEqual(list.data.map((m) => m.id), [model]);
  });

  let greedy;
  await check('chat completion: an assistant message, usage, finish reason', async () => {
    const r = await client.chat.completions.create({ model, messages, max_tokens: 12, temperature: 0 });
    assert.equal(r.object, 'chat.completion');
    assert.equal(r.choices.length, 1);
    assert.equal(r.choices[0].message.role, 'assistant');
    assert.equal(typeof r.choices[0].message.content, 'string');
    assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
    assert.ok(r.usage.prompt_tokens > 10 && r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 12);
    assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
    greedy = r;
  });

  await check('streaming: the deltas add up to the same text; usage comes last', async () => {
    const stream = await client.chat.completions.create({ model, messages, max_tokens: 12, temperature: 0, stream: true,
                                                          stream_options: { include_usage: true } });
    let text = '', role = null, finish = null, usage = null, chunks = 0;
    for await (const chunk of stream) {
      chunks++;
      assert.equal(chunk.object, 'chat.completion.chunk');
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices) {
        if (c.delta.role) role = c.delta.role;
        if (c.delta.content) text += c.delta.content;
        if (c.finish_reason) finish = c.finish_reason;
      }
    }
    assert.equal(role, 'assistant');
    assert.equal(text, greedy.choices[0].message.content);
    assert.equal(finish, greedy.choices[0].finish_reason);
    assert.deepEqual(usage, greedy.usage);
    assert.ok(chunks >= 3);
  });

  await check('n > 1: n choices, indexed; seeded sampling repeats', async () => {
    const ask = () => client.chat.completions.create({ model, messages, max_tokens: 8, n: 3, seed: 1234, temperature: 1.0 });
    const [a, b] = await Promise.all([ask(), ask()]);
    assert.deepEqual(a.choices.map((c) => c.index), [0, 1, 2]);
    assert.deepEqual(a.choices.map((c) => c.message.content), b.choices.map((c) => c.message.content));
    const other = await client.chat.completions.create({ model, messages, max_tokens: 8, n: 3, seed: 99, temperature: 1.0 });
    assert.notDeepEqual(a.choices.map((c) => c.message.content), other.choices.map((c) => c.message.content));
  });

  await check('logprobs: one per generated token, each <= 0, with its bytes', async () => {
    const r = await client.chat.completions.create({ model, messages, max_tokens: 6, logprobs: true, seed: 5 });
    const lp = r.choices[0].logprobs.content;
    assert.equal(lp.length, r.usage.completion_tokens);
    for (const t of lp) {
      assert.ok(t.logprob <= 0 && Number.isFinite(t.logprob));
      assert.ok(Array.isArray(t.bytes));
    }
  });

  await check('top_logprobs: alternatives, most likely first, the greedy token first; streamed alike', async () => {
    const ask = { model, messages, max_tokens: 6, temperature: 0, logprobs: true, top_logprobs: 3 };
    const r = await client.chat.completions.create(ask);
    const lp = r.choices[0].logprobs.content;
    assert.equal(lp.length, r.usage.completion_tokens);
    for (const t of lp) {
      assert.equal(t.top_logprobs.length, 3);
      assert.equal(t.top_logprobs[0].token, t.token);
      assert.equal(t.top_logprobs[0].logprob, t.logprob);  // the recorded log-prob, exactly
      assert.ok(t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob && t.top_logprobs[1].logprob >= t.top_logprobs[2].logprob);
    }
    const stream = await client.chat.completions.create({ ...ask, stream: true });
    const streamed = [];
    for await (const chunk of stream)
      for (const c of chunk.choices) if (c.logprobs) streamed.push(...c.logprobs.content);
    assert.deepEqual(streamed, lp);
  });

  await check('echo with logprobs scores a prompt as generation logged it (lm-evaluation-harness loglikelihood)', async () => {
    const prompt = [9707, 11, 1879, 13];
    const gen = await raw('/completions', JSON.stringify({ model, prompt, max_tokens: 1, temperature: 0, logprobs: 1, return_token_ids: true }));
    assert.equal(gen.status, 200);
    const next = gen.json.choices[0].token_ids[0];
    const scored = await client.completions.create({ model, prompt: [...prompt, next], max_tokens: 1, temperature: 0, logprobs: 1, echo: true });
    const lp = scored.choices[0].logprobs;
    assert.equal(lp.tokens.length, prompt.length + 2);
    assert.equal(lp.token_logprobs[0], null);
    assert.equal(lp.top_logprobs[0], null);
    // The continuation's score is the log-prob generation recorded for it; greedy: the top alternative.
    const cont = lp.token_logprobs[prompt.length];
    assert.ok(Math.abs(cont - gen.json.choices[0].logprobs.token_logprobs[0]) < 1e-4, `${cont} vs ${gen.json.choices[0].logprobs.token_logprobs[0]}`);
    assert.ok(Math.abs(Math.max(...Object.values(lp.top_logprobs[prompt.length])) - cont) < 1e-6);
    for (const x of lp.token_logprobs.slice(1)) assert.ok(x <= 0 && Number.isFinite(x));
  });

  await check('stop strings cut the text before the stop string', async () => {
    const r = await client.chat.completions.create({ model, messages, max_tokens: 40, stop: [' ', 'e'], seed: 3 });
    const c = r.choices[0];
    assert.ok(!c.message.content.includes(' ') && !c.message.content.includes('e'));
    if (c.finish_reason === 'length') assert.equal(r.usage.completion_tokens, 40);
  });

  await check('completions: echo, token-id prompts, return_token_ids with weight versions', async () => {
    const r = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 5, echo: true, seed: 7 });
    assert.equal(r.object, 'text_completion');
    assert.ok(r.choices[0].text.startsWith('Once upon a time'));
    const ids = await raw('/completions', JSON.stringify({ model, prompt: [9707, 11, 1879], max_tokens: 4, return_token_ids: true, seed: 7 }));
    assert.equal(ids.status, 200);
    assert.deepEqual(ids.json.prompt_token_ids, [9707, 11, 1879]);
    assert.equal(ids.json.choices[0].token_ids.length, ids.json.usage.completion_tokens);
    assert.deepEqual(ids.json.choices[0].weight_versions, ids.json.choices[0].token_ids.map(() => 0));
  });

  await check('unknown model: 404 model_not_found (SDK NotFoundError)', async () => {
    await assert.rejects(client.chat.completions.create({ model: 'gpt-4o', messages }), (e) => e.status === 404 && e.code === 'model_not_found');
  });

  await check('bad fields: 400 naming the field', async () => {
    await assert.rejects(client.chat.completions.create({ model, messages, n: 0 }), (e) => e.status === 400 && e.param === 'n');
    await assert.rejects(client.chat.completions.create({ model, messages, temperature: 7 }), (e) => e.status === 400 && e.param === 'temperature');
    await assert.rejects(client.chat.completions.create({ model, messages: [{ content: 'no role' }] }), (e) => e.status === 400 && e.param === 'messages');
    await assert.rejects(client.chat.completions.create({ model, messages, max_tokens: 1e7 }), (e) => e.status === 400 && e.code === 'context_length_exceeded');
    await assert.rejects(client.chat.completions.create({ model, messages, top_logprobs: 2 }), (e) => e.status === 400 && e.param === 'top_logprobs');
    await assert.rejects(client.chat.completions.create({ model, messages, logprobs: true, top_logprobs: 21 }), (e) => e.status === 400 && e.param === 'top_logprobs');
  });

  await check('malformed JSON: 400 with an error object', async () => {
    const r = await raw('/chat/completions', '{"model": "x", "messages": [');
    assert.equal(r.status, 400);
    assert.match(r.json.error.message, /not valid JSON/);
  });

  await check('oversized body: 413 with an error object', async () => {
    const big = JSON.stringify({ model, messages: [{ role: 'user', content: 'x'.repeat(Number(maxBody) + 10) }] });
    const r = await raw('/chat/completions', big);
    assert.equal(r.status, 413);
    assert.match(r.json.error.message, /over/);
  });

  await check('the server is unharmed: concurrent requests all answer', async () => {
    const rs = await Promise.all(Array.from({ length: 8 }, (_, i) =>
      client.chat.completions.create({ model, messages: [{ role: 'user', content: `Say ${i}` }], max_tokens: 6, seed: i })));
    for (const r of rs) assert.equal(r.choices.length, 1);
    const again = await client.chat.completions.create({ model, messages, max_tokens: 12, temperature: 0 });
    assert.equal(again.choices[0].message.content, greedy.choices[0].message.content);
  });

  await check('more requests than --max-in-flight: 429 with Retry-After, the others answer', async () => {
    // 16 (the limit) long generations hold every slot for seconds; one more is turned away.
    // One connection each (Node's http, no agent): a client-side pool would queue them.
    const post = (body) => new Promise((resolve, reject) => {
      const u = new URL(baseURL + '/completions');
      const req = http.request({ host: u.hostname, port: u.port, path: u.pathname, method: 'POST', agent: false,
                                 headers: { 'content-type': 'application/json' } }, (res) => {
        let text = '';
        res.on('data', (c) => { text += c; });
        res.on('end', () => resolve(JSON.parse(text)));
      });
      req.on('error', reject);
      req.end(JSON.stringify(body));
    });
    const long = Array.from({ length: 16 }, (_, i) => post({ model, prompt: [9707 + i], max_tokens: 400, ignore_eos: true, seed: i }));
    // Sent once the server counts all 16 in flight (its /health says so), not after a guess.
    let seen = 0;
    for (let i = 0; i < 3000 && seen < 16; i++) {
      seen = (await (await fetch(baseURL.replace(/\/v1$/, '') + '/health')).json()).in_flight;
      if (seen < 16) await new Promise((r) => setTimeout(r, 10));
    }
    assert.equal(seen, 16, 'the 16 requests never were in flight together');
    const extra = await fetch(baseURL + '/completions', { method: 'POST', headers: { 'content-type': 'application/json' },
                                                          body: JSON.stringify({ model, prompt: 'x', max_tokens: 1 }) });
    const extraText = await extra.text();
    assert.equal(extra.status, 429, `the extra request was answered ${extra.status}: ${extraText}`);
    assert.ok(extra.headers.get('retry-after'));
    const done = await Promise.all(long);
    for (const r of done) assert.equal(r.usage.completion_tokens, 400);
  });

  console.log(`openai sdk test: ${checks} checks passed`);
})();
