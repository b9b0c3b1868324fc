// Drives a running `pagoda serve` with the official `openai` npm package (v6).
// Usage: node openai_client_check.mjs <base_url> <model> <mode>
//   mode "token-ids": completions with token-id prompts (fixture models, no tokenizer)
//   mode "text":      completions and chat with text (a model with tokenizer + chat template)
//   mode "structured": tools with tool_choice "required" / named (whole and streamed),
//                     response_format json_schema and json_object, a bad schema as the SDK sees it
// Exits 0 when every check passes; prints what failed otherwise.
import { createRequire } from 'node:module';
import path from 'node:path';

const [baseURL, model, mode] = process.argv.slice(2);
const require = createRequire(path.join(process.env.PAGODA_NODE_DIR, 'package.json'));
const OpenAI = require('openai').default ?? require('openai');
const client = new OpenAI({ baseURL, apiKey: process.env.PAGODA_API_KEY ?? 'none', maxRetries: 0 });

let failures = 0;
function check(cond, what, detail) {
  if (!cond) {
    failures++;
    console.error(`FAIL: ${what}`, detail === undefined ? '' : JSON.stringify(detail).slice(0, 500));
  }
}

async function streamText(params) {
  const stream = await client.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
  let text = '', usage = null, finish = null, chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      text += c.text;
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  return { text, usage, finish, chunks };
}

const models = await client.models.list();
check(models.data.length === 1 && models.data[0].id === model, 'models.list names the model', models.data);

const prompt = mode === 'token-ids' ? [11, 22, 33, 44, 55] : 'It is a truth universally acknowledged';
const full = await client.completions.create({ model, prompt, max_tokens: 8, temperature: 0 });
check(full.object === 'text_completion', 'completion object', full);
check(full.choices.length === 1 && typeof full.choices[0].text === 'string', 'one text choice', full);
check(full.usage.completion_tokens >= 1 && full.usage.completion_tokens <= 8, 'usage.completion_tokens', full.usage);
check(full.usage.prompt_tokens_details && 'cached_tokens' in full.usage.prompt_tokens_details, 'cached_tokens', full.usage);

const streamed = await streamText({ model, prompt, max_tokens: 8, temperature: 0 });
check(streamed.text === full.choices[0].text, 'streamed text equals the non-streamed text', [streamed.text, full.choices[0].text]);
check(streamed.usage && streamed.usage.completion_tokens === full.usage.completion_tokens, 'include_usage chunk', streamed.usage);
check(streamed.chunks >= 2, 'several chunks', streamed.chunks);

const seeded = { model, prompt, max_tokens: 6, temperature: 0.9, seed: 7, n: 2 };
const s1 = await client.completions.create(seeded);
const s2 = await client.completions.create(seeded);
check(s1.choices.length === 2, 'n=2 gives two choices', s1.choices);
check(JSON.stringify(s1.choices.map(c => c.text)) === JSON.stringify(s2.choices.map(c => c.text)), 'seed reproducible', [s1.choices, s2.choices]);

try {
  await client.completions.create({ model, prompt, max_tokens: 8, temperature: -1 });
  check(false, 'negative temperature must fail');
} catch (e) {
  check(e.status === 400 && e.error?.param === 'temperature', 'negative temperature is a 400 naming the param', e.error);
}
try {
  await client.completions.create({ model: 'no-such-model', prompt, max_tokens: 8 });
  check(false, 'unknown model must fail');
} catch (e) {
  check(e.status === 400, 'unknown model is a 400', e.status);
}

if (mode === 'text') {
  const messages = [{ role: 'system', content: 'You answer briefly.' }, { role: 'user', content: 'Who is Elizabeth?' }];
  const chat = await client.chat.completions.create({ model, messages, max_tokens: 12, temperature: 0 });
  check(chat.object === 'chat.completion', 'chat object', chat);
  check(chat.choices[0].message.role === 'assistant' && typeof chat.choices[0].message.content === 'string', 'assistant message', chat.choices[0]);
  const again = await client.chat.completions.create({ model, messages, max_tokens: 12, temperature: 0 });
  check(again.usage.prompt_tokens_details.cached_tokens > 0, 'repeat chat hits the prefix cache', again.usage);
  check(again.choices[0].message.content === chat.choices[0].message.content, 'hit and miss agree (greedy)');
  const stream = await client.chat.completions.create({ model, messages, max_tokens: 12, temperature: 0, stream: true, stream_options: { include_usage: true } });
  let content = '', role = null, usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      if (c.delta.role) role = c.delta.role;
      content += c.delta.content ?? '';
    }
  }
  check(role === 'assistant', 'first delta carries the role');
  check(content === chat.choices[0].message.content, 'streamed chat equals non-streamed', [content, chat.choices[0].message.content]);
  check(usage && usage.completion_tokens === chat.usage.completion_tokens, 'chat include_usage', usage);
  const lp = await client.chat.completions.create({ model, messages, max_tokens: 3, temperature: 0, logprobs: true, top_logprobs: 2 });
  check(lp.choices[0].logprobs?.content?.length >= 1 && lp.choices[0].logprobs.content[0].top_logprobs.length === 2, 'chat logprobs', lp.choices[0].logprobs);
  try {
    await client.chat.completions.create({ model, messages: [], max_tokens: 4 });
    check(false, 'empty messages must fail');
  } catch (e) {
    check(e.status === 400 && e.error?.param === 'messages', 'empty messages is a 400', e.error);
  }
}

if (mode === 'structured') {
  const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];
  const weatherParams = {
    type: 'object',
    properties: { city: { type: 'string', maxLength: 16 }, unit: { type: 'string', enum: ['celsius', 'fahrenheit'] } },
    required: ['city', 'unit'],
    additionalProperties: false,
  };
  const tools = [
    { type: 'function', function: { name: 'get_weather', description: 'Weather of a city', parameters: weatherParams } },
    { type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: { tz: { type: 'string', maxLength: 8 } }, required: ['tz'] } } },
  ];
  const validWeather = (args) => typeof args.city === 'string' && args.city.length <= 16 &&
    ['celsius', 'fahrenheit'].includes(args.unit) && Object.keys(args).every(k => k === 'city' || k === 'unit');

  const required = await client.chat.completions.create({ model, messages, tools, tool_choice: 'required', parallel_tool_calls: false, max_tokens: 200, seed: 3 });
  const rc = required.choices[0];
  check(rc.finish_reason === 'tool_calls', 'tool_choice required ends with tool_calls', rc);
  check(rc.message.tool_calls?.length === 1 && rc.message.tool_calls[0].type === 'function', 'one function call', rc.message);
  const call = rc.message.tool_calls?.[0];
  if (call) {
    const args = JSON.parse(call.function.arguments);
    check(['get_weather', 'get_time'].includes(call.function.name), 'a declared tool is called', call);
    if (call.function.name === 'get_weather') check(validWeather(args), 'arguments follow the tool schema', args);
    else check(typeof args.tz === 'string' && args.tz.length <= 8, 'arguments follow the tool schema', args);
  }

  const named = await client.chat.completions.create({ model, messages, tools, tool_choice: { type: 'function', function: { name: 'get_weather' } }, max_tokens: 200, seed: 5 });
  const nc = named.choices[0];
  check(nc.message.tool_calls?.length === 1 && nc.message.tool_calls[0].function.name === 'get_weather', 'named tool_choice calls that tool', nc.message);
  if (nc.message.tool_calls?.[0]) check(validWeather(JSON.parse(nc.message.tool_calls[0].function.arguments)), 'named call arguments valid', nc.message.tool_calls[0]);

  // Streamed: the SDK reassembles delta.tool_calls; the result equals the whole response.
  const stream = await client.chat.completions.create({ model, messages, tools, tool_choice: { type: 'function', function: { name: 'get_weather' } }, max_tokens: 200, seed: 5, stream: true });
  const streamedCalls = [];
  let streamFinish = null;
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      if (c.finish_reason) streamFinish = c.finish_reason;
      for (const tc of c.delta.tool_calls ?? []) {
        const slot = streamedCalls[tc.index] ?? (streamedCalls[tc.index] = { name: '', arguments: '' });
        slot.name += tc.function?.name ?? '';
        slot.arguments += tc.function?.arguments ?? '';
      }
    }
  }
  check(streamFinish === 'tool_calls', 'streamed tool call finishes with tool_calls', streamFinish);
  check(streamedCalls.length === 1 && streamedCalls[0].name === 'get_weather' &&
        streamedCalls[0].arguments === nc.message.tool_calls?.[0]?.function.arguments, 'streamed tool call equals the whole one', [streamedCalls, nc.message.tool_calls]);

  const personSchema = {
    type: 'object',
    properties: { name: { type: 'string', maxLength: 20 }, age: { type: 'integer', minimum: 0 }, tags: { type: 'array', items: { type: 'string', maxLength: 8 }, maxItems: 3 } },
    required: ['name', 'age', 'tags'],
    additionalProperties: false,
  };
  for (const seed of [1, 2, 3]) {
    const r = await client.chat.completions.create({
      model, messages: [{ role: 'user', content: 'Describe a person.' }], max_tokens: 300, seed,
      response_format: { type: 'json_schema', json_schema: { name: 'person', strict: true, schema: personSchema } },
    });
    const text = r.choices[0].message.content;
    let value = null;
    try { value = JSON.parse(text); } catch (e) { check(false, 'json_schema output parses', text); }
    if (value) {
      check(typeof value.name === 'string' && value.name.length <= 20 && Number.isInteger(value.age) && value.age >= 0 &&
            Array.isArray(value.tags) && value.tags.length <= 3 && value.tags.every(t => typeof t === 'string' && t.length <= 8) &&
            Object.keys(value).every(k => ['name', 'age', 'tags'].includes(k)), 'json_schema output validates', value);
    }
  }
  const obj = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'JSON please' }], max_tokens: 400, seed: 4, response_format: { type: 'json_object' } });
  if (obj.choices[0].finish_reason === 'stop') {
    let value = null;
    try { value = JSON.parse(obj.choices[0].message.content); } catch (e) {}
    check(value !== null && typeof value === 'object' && !Array.isArray(value), 'json_object output is an object', obj.choices[0].message.content);
  }
  try {
    await client.chat.completions.create({ model, messages, response_format: { type: 'json_schema', json_schema: { name: 'bad', schema: { type: 'object', properties: { n: { type: 'integer', maximum: 3 } } } } } });
    check(false, 'an unsupported schema keyword must fail');
  } catch (e) {
    check(e.status === 400 && e.error?.param === 'response_format.json_schema.schema' &&
          String(e.error?.message).startsWith('response_format.json_schema.schema.properties.n.maximum'), 'bad schema is a 400 naming the path', e.error);
  }
}

if (failures) {
  console.error(`${failures} check(s) failed`);
  process.exit(1);
}
console.log('openai client checks passed');
