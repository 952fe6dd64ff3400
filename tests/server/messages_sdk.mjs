// Anthropic's Messages API driven by Anthropic's own JavaScript SDK (scripts/fetch-fixtures.sh
// fetches it): node messages_sdk.mjs <sdk index.mjs> <base URL> <model>. The SDK's stream helper
// rebuilds the message from the events (throwing on one out of order) and parses tool input from
// its partial JSON. Prints "ok" and exits 0, or the failure and exits 1.
// Run by MessagesTest.AnthropicsSdkReadsWhatTheServerSends.
const [sdkPath, baseURL, model] = process.argv.slice(2);
const { default: Anthropic, NotFoundError, BadRequestError } = await import(sdkPath);
const client = new Anthropic({ baseURL, apiKey: 'none', maxRetries: 0, timeout: 120_000 });

function check(cond, what) {
  if (!cond) throw new Error(`check failed: ${what}`);
}
const textOf = (m) => m.content.filter((b) => b.type === 'text').map((b) => b.text).join('');

// ASCII only: the synthetic model's byte tokenizer hands out a character's bytes one by one.
const asciiOnly = {};
for (let b = 0x80; b < 0x100; ++b) asciiOnly[String(3 + b)] = -100;
const sampling = { temperature: 0.8, seed: 5, logit_bias: asciiOnly };
const messages = [{ role: 'user', content: 'Tell me a story.' }];

// Whole and streamed: the same text (same seed).
const whole = await client.messages.create({ model, max_tokens: 24, system: 'Be brief.', messages, ...sampling });
check(whole.type === 'message' && whole.role === 'assistant', `type ${whole.type}`);
check(whole.stop_reason === 'max_tokens', `stop_reason ${whole.stop_reason}`);
check(whole.content.length === 1 && whole.content[0].type === 'text' && textOf(whole).length > 0, 'one text block');
check(whole.usage.output_tokens === 24, `usage ${JSON.stringify(whole.usage)}`);

const stream = client.messages.stream({ model, max_tokens: 24, system: 'Be brief.', messages, ...sampling });
const types = [];
stream.on('streamEvent', (e) => types.push(e.type));
const streamed = await stream.finalMessage();
check(textOf(streamed) === textOf(whole), `streamed "${textOf(streamed)}" vs whole "${textOf(whole)}"`);
check((await stream.finalText()) === textOf(whole), 'finalText');
check(types[0] === 'message_start' && types.at(-1) === 'message_stop', `events ${types[0]} .. ${types.at(-1)}`);
check(streamed.usage.cache_read_input_tokens > 0, 'the same prompt read from the KV cache');

// count_tokens: the prompt the request runs on.
const counted = await client.messages.countTokens({ model, system: 'Be brief.', messages });
check(counted.input_tokens === whole.usage.input_tokens + whole.usage.cache_read_input_tokens,
      `count_tokens ${counted.input_tokens} vs ${JSON.stringify(whole.usage)}`);

// A forced tool call (its input parsed from partial JSON when streamed), and its result sent back.
const tools = [{ name: 'weather', description: 'The weather in a city',
                 input_schema: { type: 'object', properties: { city: { type: 'string', maxLength: 10 } }, required: ['city'] } }];
const ask = [{ role: 'user', content: 'What is the weather in Paris?' }];
const called = await client.messages.create({ model, max_tokens: 200, messages: ask, tools,
                                              tool_choice: { type: 'tool', name: 'weather' }, ...sampling });
const uses = called.content.filter((b) => b.type === 'tool_use');
check(called.stop_reason === 'tool_use' && uses.length === 1, `content ${JSON.stringify(called.content)}`);
check(uses[0].name === 'weather' && typeof uses[0].input.city === 'string' && uses[0].id.length > 0, `tool_use ${JSON.stringify(uses[0])}`);
const callStream = client.messages.stream({ model, max_tokens: 200, messages: ask, tools,
                                            tool_choice: { type: 'tool', name: 'weather' }, ...sampling });
const callStreamed = await callStream.finalMessage();
const streamedUses = callStreamed.content.filter((b) => b.type === 'tool_use');
check(streamedUses.length === 1 && JSON.stringify(streamedUses[0].input) === JSON.stringify(uses[0].input),
      `streamed tool input ${JSON.stringify(streamedUses[0]?.input)} vs ${JSON.stringify(uses[0].input)}`);

const next = await client.messages.create({
  model, max_tokens: 8, tools, ...sampling,
  messages: [...ask, { role: 'assistant', content: called.content },
             { role: 'user', content: [{ type: 'tool_result', tool_use_id: uses[0].id, content: 'sunny, 21 C' }] }],
});
check(textOf(next).length > 0 || next.content.length > 0, 'a turn after the call');
check(next.usage.cache_read_input_tokens > 0, 'the conversation read from the KV cache');

// Errors the SDK raises as its own classes.
let refused = false;
try {
  await client.messages.create({ model, max_tokens: 4,
    messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AA==' } }] }] });
} catch (e) {
  refused = e instanceof BadRequestError && /image/.test(e.message);
}
check(refused, 'an image is a 400 naming it');
let unknown = false;
try {
  await client.messages.create({ model: 'nobody', max_tokens: 4, messages });
} catch (e) {
  unknown = e instanceof NotFoundError;
}
check(unknown, 'an unknown model is a 404');
console.log('ok');
