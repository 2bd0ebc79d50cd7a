// A calculator agent on the OpenAI Node SDK (npm `openai`), as rlx's `agent_program`
// environment runs it: in the sandbox, with no network; the SDK reaches the policy through
// the gateway's unix socket (RLX_GATEWAY_SOCKET). The task comes on stdin:
//   {"prompt": "What is (12 * 34) + 5?", "answer": 413}
// The agent offers a `calculator` tool; while the model calls it, it runs the calls and sends
// the results back; an answer without a number is asked again; the first answer with a
// number ends the episode. Its last stdout line is {"answer": <that answer's last number>}:
// the environment gives reward 1 when it equals the task's answer. At most task.max_calls
// (default 4) calls.
//
// Outside rlx it runs against any OpenAI-compatible server:
//   OPENAI_BASE_URL=http://127.0.0.1:8000/v1 RLX_MODEL=NAME node calculator_agent.js <<< '{"prompt": "2+2?", "answer": 4}'
'use strict';
const fs = require('fs');
const http = require('http');
const sdk = require('openai');
const OpenAI = sdk.OpenAI || sdk.default || sdk;

// fetch over a unix socket: Node's http client speaks HTTP on any socket; the SDK takes a
// fetch of our choosing. The answer is a plain object with what the SDK reads of a Response
// (status, ok, url, headers, text, json; body for streams, which the gateway does not do).
// In the sandbox, give Node an address-space limit (env.sandbox.limits.memory_mb) of 12 GiB
// or more: the SDK loads Node's fetch internals, whose WebAssembly HTTP parser reserves about
// 10 GiB of address space (reserved, not used).
function unixSocketFetch(socketPath) {
  return (url, init = {}) => new Promise((resolve, reject) => {
    const u = new URL(url);
    const headers = {};
    new Headers(init.headers || {}).forEach((v, k) => { headers[k] = v; });
    const req = http.request({ socketPath, path: u.pathname + u.search, method: init.method || 'GET', headers }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => {
        const h = new Headers();
        for (const [k, v] of Object.entries(res.headers)) h.set(k, Array.isArray(v) ? v.join(', ') : String(v));
        const text = Buffer.concat(chunks).toString('utf8');
        resolve({
          status: res.statusCode, statusText: res.statusMessage || '', ok: res.statusCode >= 200 && res.statusCode < 300,
          url: String(url), headers: h, body: null,
          text: async () => text, json: async () => JSON.parse(text),
        });
      });
      res.on('error', reject);
    });
    req.on('error', reject);
    if (init.signal) init.signal.addEventListener('abort', () => req.destroy(new Error('aborted')));
    if (init.body) req.write(init.body);
    req.end();
  });
}

// + - * / and parentheses over numbers; anything else throws.
function calculate(text) {
  let i = 0;
  const peek = () => { while (text[i] === ' ') i++; return text[i]; };
  const number = () => {
    const m = /^\d+(\.\d+)?/.exec(text.slice(i));
    if (!m) throw new Error(`expected a number at ${i}`);
    i += m[0].length;
    return Number(m[0]);
  };
  const factor = () => {
    const c = peek();
    if (c === '-') { i++; return -factor(); }
    if (c === '(') { i++; const v = sum(); if (peek() !== ')') throw new Error(`expected ')' at ${i}`); i++; return v; }
    return number();
  };
  const product = () => {
    let v = factor();
    for (let c = peek(); c === '*' || c === '/'; c = peek()) { i++; v = c === '*' ? v * factor() : v / factor(); }
    return v;
  };
  const sum = () => {
    let v = product();
    for (let c = peek(); c === '+' || c === '-'; c = peek()) { i++; v = c === '+' ? v + product() : v - product(); }
    return v;
  };
  if (text.length > 200) throw new Error('expression too long');
  const v = sum();
  if (peek() !== undefined) throw new Error(`unexpected '${text[i]}' at ${i}`);
  return v;
}

const tools = [{
  type: 'function',
  function: {
    name: 'calculator',
    description: 'Evaluate an arithmetic expression with + - * / and parentheses.',
    parameters: { type: 'object', properties: { expression: { type: 'string' } }, required: ['expression'] },
  },
}];

async function main() {
  const task = JSON.parse(fs.readFileSync(0, 'utf8'));
  const socket = process.env.RLX_GATEWAY_SOCKET;
  const client = new OpenAI({
    baseURL: socket ? 'http://gateway/v1' : process.env.OPENAI_BASE_URL,
    apiKey: process.env.OPENAI_API_KEY || 'none',
    maxRetries: 0,
    ...(socket ? { fetch: unixSocketFetch(socket) } : {}),
  });
  const messages = [
    { role: 'system', content: 'Use the calculator tool for arithmetic, then give the final number.' },
    { role: 'user', content: task.prompt },
  ];
  for (let call = 0; call < (task.max_calls || 4); call++) {
    // (Through rlx's gateway the run's rollout.max_new_tokens bounds a turn instead.)
    const r = await client.chat.completions.create({ model: process.env.RLX_MODEL || 'policy', messages, tools, max_tokens: 512 });
    const message = r.choices[0].message;
    messages.push(message);
    if (!message.tool_calls || message.tool_calls.length === 0) {
      const numbers = (message.content || '').match(/-?\d+(\.\d+)?/g);
      if (numbers) {
        console.log(JSON.stringify({ answer: Number(numbers[numbers.length - 1]) }));
        return;
      }
      messages.push({ role: 'user', content: 'Please answer with a number.' });
      continue;
    }
    for (const tc of message.tool_calls) {
      let result;
      try {
        result = String(calculate(JSON.parse(tc.function.arguments).expression));
      } catch (e) {
        result = `error: ${e.message}`;
      }
      messages.push({ role: 'tool', tool_call_id: tc.id, content: result });
    }
  }
  console.log(JSON.stringify({ answer: null }));
}

main().catch((e) => {
  console.error(e && e.stack ? e.stack : String(e));
  process.exit(1);
});
