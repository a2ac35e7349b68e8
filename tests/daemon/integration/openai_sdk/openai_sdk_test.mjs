// kestreld's HTTP API through the official OpenAI Node SDK (the `openai` package pinned in package-lock.json):
// models; completions and chat completions, whole and streamed (the same greedy text both ways, usage in the last
// chunk), with logprobs; a conversation with a tool call in its history (rendered by the model's chat template);
// errors as the SDK's typed exceptions; and a stream aborted by the client, whose session the daemon must free.
//
//   node openai_sdk_test.mjs --base-url http://127.0.0.1:PORT/v1 --model ID [--api-key KEY]
//
// Prints one "ok <name>" line per check; exits 1 at the first failure with what differed. Started by
// tests/daemon/integration/test_http_clients.cpp against a daemon it runs.
import assert from 'node:assert/strict';
import { parseArgs } from 'node:util';

import OpenAI from 'openai';

const { values: args } = parseArgs({
  options: {
    'base-url': { type: 'string' },
    model: { type: 'string' },
    'api-key': { type: 'string', default: 'none' },
  },
});
const baseURL = args['base-url'];
const model = args.model;
assert.ok(baseURL && model, 'usage: --base-url URL --model ID');
const root = baseURL.replace(/\/v1\/?$/, '');
const client = new OpenAI({ baseURL, apiKey: args['api-key'], maxRetries: 0, timeout: 120_000 });

const checks = [];
function check(name, fn) {
  checks.push([name, fn]);
}

// The value of one sample of GET /metrics, e.g. metric('kestrel:num_sessions').
async function metric(name, labels = '') {
  const text = await (await fetch(`${root}/metrics`)).text();
  const line = text.split('\n').find((l) => l.startsWith(`${name}${labels} `));
  assert.ok(line, `${name}${labels} is not on /metrics`);
  return Number(line.split(' ').pop());
}

async function until(what, predicate, ms = 20_000) {
  const end = Date.now() + ms;
  for (;;) {
    if (await predicate()) return;
    if (Date.now() > end) assert.fail(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

check('models.list', async () => {
  const page = await client.models.list();
  assert.ok(page.data.some((m) => m.id === model), `model ${model} not in ${JSON.stringify(page.data)}`);
  const one = await client.models.retrieve(model);
  assert.equal(one.id, model);
});

const prompt = 'The kestrel hovers over the field and';

check('completions: whole and streamed agree', async () => {
  const request = { model, prompt, max_tokens: 12, temperature: 0 };
  const whole = await client.completions.create(request);
  assert.equal(whole.object, 'text_completion');
  assert.equal(whole.model, model);
  assert.equal(whole.choices.length, 1);
  const text = whole.choices[0].text;
  assert.equal(typeof text, 'string');
  assert.ok(['length', 'stop'].includes(whole.choices[0].finish_reason));
  assert.ok(whole.usage.prompt_tokens > 0);
  assert.equal(whole.usage.total_tokens, whole.usage.prompt_tokens + whole.usage.completion_tokens);
  if (whole.choices[0].finish_reason === 'length') assert.equal(whole.usage.completion_tokens, 12);

  const stream = await client.completions.create({ ...request, stream: true, stream_options: { include_usage: true } });
  let streamed = '';
  let usage = null;
  let finish = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      streamed += c.text;
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.equal(streamed, text, 'greedy: the stream spells the same text');
  assert.equal(finish, whole.choices[0].finish_reason);
  assert.deepEqual(usage, whole.usage);
});

check('completions: seed, stop and logprobs', async () => {
  const a = await client.completions.create({ model, prompt, max_tokens: 8, temperature: 1, seed: 1234, logprobs: 3 });
  const b = await client.completions.create({ model, prompt, max_tokens: 8, temperature: 1, seed: 1234, logprobs: 3 });
  assert.equal(a.choices[0].text, b.choices[0].text, 'the same seed gives the same text');
  const lp = a.choices[0].logprobs;
  assert.equal(lp.tokens.length, a.usage.completion_tokens);
  assert.equal(lp.token_logprobs.length, lp.tokens.length);
  for (const v of lp.token_logprobs) assert.ok(v <= 0);
  for (const top of lp.top_logprobs) assert.ok(Object.keys(top).length >= 1 && Object.keys(top).length <= 3);
  // A token may end inside a character (its string then holds U+FFFD); otherwise the tokens spell the text.
  if (!lp.tokens.some((t) => t.includes('\uFFFD'))) assert.equal(lp.tokens.join(''), a.choices[0].text);

  const stopAt = Array.from(a.choices[0].text).slice(2, 4).join('');
  if (stopAt.length > 0) {
    const s = await client.completions.create({ model, prompt, max_tokens: 8, temperature: 1, seed: 1234, stop: [stopAt] });
    assert.equal(s.choices[0].finish_reason, 'stop');
    assert.ok(!s.choices[0].text.includes(stopAt), 'the text ends before the stop string');
  }
});

const conversation = [
  { role: 'system', content: 'You are a terse ornithologist.' },
  { role: 'user', content: 'Name a bird of prey.' },
];

check('chat: whole and streamed agree, with usage and logprobs', async () => {
  // chat_template_kwargs is vLLM's extension; the SDK passes unknown body fields through.
  const request = {
    model,
    messages: conversation,
    max_tokens: 12,
    temperature: 0,
    logprobs: true,
    top_logprobs: 2,
    chat_template_kwargs: { enable_thinking: false },
  };
  const whole = await client.chat.completions.create(request);
  assert.equal(whole.object, 'chat.completion');
  assert.equal(whole.choices.length, 1);
  const message = whole.choices[0].message;
  assert.equal(message.role, 'assistant');
  assert.equal(typeof message.content, 'string');
  const finish = whole.choices[0].finish_reason;
  assert.ok(['length', 'stop'].includes(finish));
  assert.ok(whole.usage.prompt_tokens > 10, 'the rendered conversation is the prompt');
  const content = whole.choices[0].logprobs.content;
  assert.equal(content.length, whole.usage.completion_tokens);
  for (const t of content) {
    assert.ok(t.logprob <= 0 && Array.isArray(t.bytes) && t.top_logprobs.length === 2);
  }

  const stream = await client.chat.completions.create({
    ...request,
    stream: true,
    stream_options: { include_usage: true },
  });
  let text = '';
  let role = null;
  let usage = null;
  let streamedFinish = null;
  let tokens = 0;
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      if (c.delta.role) role = c.delta.role;
      if (c.delta.content) text += c.delta.content;
      if (c.logprobs) tokens += c.logprobs.content.length;
      if (c.finish_reason) streamedFinish = c.finish_reason;
    }
  }
  assert.equal(role, 'assistant');
  assert.equal(text, message.content, 'greedy: the stream spells the same answer');
  assert.equal(streamedFinish, finish);
  assert.deepEqual(usage, whole.usage);
  assert.equal(tokens, whole.usage.completion_tokens);
});

check('chat: a conversation with a tool call and its result', async () => {
  const r = await client.chat.completions.create({
    model,
    max_tokens: 4,
    messages: [
      ...conversation,
      {
        role: 'assistant',
        content: null,
        tool_calls: [{ id: 'c1', type: 'function', function: { name: 'lookup', arguments: '{"bird": "kestrel"}' } }],
      },
      { role: 'tool', tool_call_id: 'c1', content: 'Falco tinnunculus' },
    ],
  });
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.ok(r.usage.prompt_tokens > 20);
});

check('errors are the SDK exceptions with the message', async () => {
  await assert.rejects(
    client.chat.completions.create({
      model,
      messages: conversation,
      tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object' } } }],
    }),
    (e) => {
      assert.ok(e instanceof OpenAI.BadRequestError, `got ${e}`);
      assert.equal(e.param, 'tools');
      assert.match(e.message, /cannot honour/);
      return true;
    },
  );
  await assert.rejects(client.chat.completions.create({ model, messages: conversation, n: 3 }), (e) => {
    assert.equal(e.status, 400);
    assert.equal(e.param, 'n');
    return true;
  });
  await assert.rejects(client.completions.create({ model, prompt, n: 2 }), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError, `got ${e}`);
    assert.equal(e.status, 400);
    assert.equal(e.param, 'n');
    assert.match(e.message, /one choice per request/);
    return true;
  });
  await assert.rejects(client.completions.create({ model: 'gpt-4o', prompt }), (e) => {
    assert.ok(e instanceof OpenAI.NotFoundError, `got ${e}`);
    assert.match(e.message, /does not exist/);
    return true;
  });
  await assert.rejects(client.completions.create({ model, prompt, max_tokens: -1 }), (e) => {
    assert.equal(e.status, 400);
    assert.equal(e.param, 'max_tokens');
    return true;
  });
});

check('an aborted stream frees its session', async () => {
  const ac = new AbortController();
  const stream = await client.completions.create(
    { model, prompt, max_tokens: 100_000, ignore_eos: true, stream: true },
    { signal: ac.signal },
  );
  let chunks = 0;
  try {
    for await (const chunk of stream) {
      if (chunk.choices.length > 0 && ++chunks === 3) {
        ac.abort();  // the connection closes; chunks already read would still be yielded, so stop here
        break;
      }
    }
  } catch (e) {
    // Some SDK versions throw their abort error out of the iteration instead of ending it.
    if (!(e instanceof OpenAI.APIUserAbortError || e.name === 'AbortError')) throw e;
  }
  assert.equal(chunks, 3);
  await until('the aborted stream to end in the daemon', async () =>
    (await metric('kestrel:num_requests_running', '{transport="http"}')) === 0 &&
    (await metric('kestrel:num_sessions')) === 0,
  );
  assert.ok((await metric('kestrel:request_failure_total', '{transport="http",code="cancelled"}')) >= 1);
});

let failed = false;
for (const [name, fn] of checks) {
  try {
    await fn();
    console.log(`ok ${name}`);
  } catch (e) {
    console.log(`FAILED ${name}: ${e.stack ?? e}`);
    failed = true;
    break;
  }
}
process.exit(failed ? 1 : 0);
