// The Responses API driven by OpenAI's own JavaScript SDK (scripts/fetch-fixtures.sh fetches
// it): node responses_sdk.mjs <sdk index.mjs> <base URL> <model>. The SDK's stream helper
// rebuilds the response from the typed events (and throws on one out of place); its
// output_text reads the message items; background responses are polled and cancelled. Prints "ok" and exits 0, or the failure and exits 1.
// Run by ResponsesTest.OpenAisSdkReadsWhatTheServerSends.
const [sdkPath, baseURL, model] = process.argv.slice(2);
const { default: OpenAI, NotFoundError, BadRequestError } = await import(sdkPath);
const client = new OpenAI({ baseURL, apiKey: 'none', maxRetries: 0, timeout: 120_000 });

// The stream helper's final response has no output_text (create() adds it): the same join of
// the message items' output_text parts.
const textOf = (r) => r.output.filter((o) => o.type === 'message')
  .flatMap((o) => o.content.filter((c) => c.type === 'output_text').map((c) => c.text)).join('');

function check(cond, what) {
  if (!cond) throw new Error(`check failed: ${what}`);
}

// ASCII only: the synthetic model's byte tokenizer hands out a character's bytes one by one.
const asciiOnly = {};
for (let b = 0x80; b < 0x100; ++b) asciiOnly[String(3 + b)] = -100;
const sampling = { temperature: 0.8, seed: 5, logit_bias: asciiOnly };

// Whole and streamed: the same text (same seed), events in order.
const whole = await client.responses.create({ model, input: 'Tell me a story.', max_output_tokens: 24, ...sampling });
check(whole.object === 'response', `object ${whole.object}`);
check(whole.status === 'incomplete' && whole.incomplete_details?.reason === 'max_output_tokens', `status ${whole.status}`);
check(whole.output.length === 1 && whole.output[0].type === 'message', `output ${JSON.stringify(whole.output)}`);
check(typeof whole.output_text === 'string' && whole.output_text.length > 0, 'output_text');
check(whole.usage.output_tokens === 24, `usage ${JSON.stringify(whole.usage)}`);

const stream = client.responses.stream({ model, input: 'Tell me a story.', max_output_tokens: 24, ...sampling });
const seen = [];
for await (const e of stream) seen.push(e);
const streamed = await stream.finalResponse();
check(textOf(whole) === whole.output_text, 'output_text is the message text');
check(textOf(streamed) === whole.output_text, `streamed "${textOf(streamed)}" vs whole "${whole.output_text}"`);
check(seen[0].type === 'response.created' && seen.at(-1).type === 'response.incomplete', `event types ${seen[0].type} .. ${seen.at(-1).type}`);
seen.forEach((e, i) => check(e.sequence_number === i, `sequence_number ${e.sequence_number} at ${i}`));
const deltas = seen.filter((e) => e.type === 'response.output_text.delta').map((e) => e.delta).join('');
check(deltas === whole.output_text, 'the deltas make the text');

// A forced function call, its output sent back as the next turn's input, and the same turn
// by previous_response_id (the server keeps the conversation; its KV cache is reused).
const tools = [{ type: 'function', name: 'weather', description: 'The weather in a city',
                 parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 10 } }, required: ['city'] } }];
const input = [{ role: 'user', content: 'What is the weather in Paris?' }];
const called = await client.responses.create({ model, input, tools, tool_choice: { type: 'function', name: 'weather' },
                                               max_output_tokens: 200, ...sampling });
const calls = called.output.filter((o) => o.type === 'function_call');
check(called.status === 'completed' && calls.length === 1, `call output ${JSON.stringify(called.output)}`);
check(calls[0].name === 'weather' && typeof JSON.parse(calls[0].arguments).city === 'string', `call ${JSON.stringify(calls[0])}`);
check(calls[0].call_id.length > 0 && calls[0].id.startsWith('fc_'), 'ids');
const callStream = client.responses.stream({ model, input, tools, tool_choice: { type: 'function', name: 'weather' },
                                             max_output_tokens: 200, ...sampling });
const callStreamed = await callStream.finalResponse();
const streamedCalls = callStreamed.output.filter((o) => o.type === 'function_call');
check(streamedCalls.length === 1 && streamedCalls[0].arguments === calls[0].arguments, 'the streamed call');

const result = { type: 'function_call_output', call_id: calls[0].call_id, output: 'sunny, 21 C' };
const next = await client.responses.create({ model, input: [...input, ...called.output, result], tools,
                                            max_output_tokens: 8, ...sampling });
check(next.output_text.length > 0, 'a turn after the call');
const chained = await client.responses.create({ model, previous_response_id: called.id, input: [result], tools,
                                               max_output_tokens: 8, ...sampling });
check(chained.previous_response_id === called.id, 'previous_response_id repeated');
check(chained.output_text === next.output_text, `chained "${chained.output_text}" vs sent "${next.output_text}"`);
check(chained.usage.input_tokens === next.usage.input_tokens, 'the same conversation');
check(chained.usage.input_tokens_details.cached_tokens > 0, 'the conversation read from the KV cache');

// Input items, listed back page by page (the SDK follows has_more with `after`), newest first.
const listed = [];
for await (const item of client.responses.inputItems.list(next.id, { limit: 1 })) listed.push(item);
check(listed.length === 3, `input items ${JSON.stringify(listed)}`);
check(listed[0].type === 'function_call_output' && listed[0].call_id === calls[0].call_id, 'newest first');
check(listed[1].type === 'function_call' && listed[2].type === 'message' && listed[2].role === 'user', 'then the call, then the question');
check(listed[2].content[0].type === 'input_text' && listed[2].content[0].text === input[0].content, 'a string content as input_text');
const ascending = await client.responses.inputItems.list(next.id, { order: 'asc' });
check(ascending.data.map((i) => i.id).join() === listed.map((i) => i.id).reverse().join(), 'order=asc');

// Stored: retrieved, deleted, then gone.
const got = await client.responses.retrieve(called.id);
check(got.id === called.id && got.output.length === called.output.length, 'retrieve');
await client.responses.delete(called.id);
let gone = false;
try {
  await client.responses.retrieve(called.id);
} catch (e) {
  gone = e instanceof NotFoundError;
}
check(gone, 'a deleted response is gone (404)');

// In the background: queued at once, retrieved until it ended (the whole response's text), and
// a long one cancelled through the SDK's cancel().
const queued = await client.responses.create({ model, input: 'Tell me a story.', max_output_tokens: 24, background: true,
                                               ...sampling });
check(queued.status === 'queued' && queued.background === true, `background status ${queued.status}`);
let polled = queued;
for (let i = 0; i < 6000 && (polled.status === 'queued' || polled.status === 'in_progress'); ++i) {
  await new Promise((r) => setTimeout(r, 10));
  polled = await client.responses.retrieve(queued.id);
}
check(polled.status === whole.status && polled.output_text === whole.output_text,
      `background "${polled.output_text}" (${polled.status}) vs whole "${whole.output_text}"`);
// Streamed in the background: the events as they come, then again past starting_after through
// retrieve(id, { stream: true }).
const bgStream = await client.responses.create({ model, input: 'Tell me a story.', max_output_tokens: 24, background: true,
                                                 stream: true, ...sampling });
const bgEvents = [];
for await (const e of bgStream) bgEvents.push(e);
const bgText = bgEvents.filter((e) => e.type === 'response.output_text.delta').map((e) => e.delta).join('');
check(bgEvents[0].type === 'response.created' && bgEvents[0].response.status === 'queued', `first event ${bgEvents[0].type}`);
check(bgText === whole.output_text, `streamed background "${bgText}" vs whole "${whole.output_text}"`);
const again = await client.responses.retrieve(bgEvents[0].response.id, { stream: true, starting_after: 1 });
const againEvents = [];
for await (const e of again) againEvents.push(e);
check(againEvents.length === bgEvents.length - 2 && againEvents[0].sequence_number === 2, `resumed ${againEvents.length} events`);
const long = await client.responses.create({ model, input: 'Go on.', max_output_tokens: 1500, ignore_eos: true,
                                             background: true, ...sampling });
const stopped = await client.responses.cancel(long.id);
check(stopped.id === long.id && stopped.status === 'cancelled', `cancel: ${stopped.status}`);

// Errors the SDK raises as its own classes.
let refused = false;
try {
  await client.responses.create({ model, input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'x' }] }] });
} catch (e) {
  refused = e instanceof BadRequestError && /input_image/.test(e.message);
}
check(refused, 'an image is a 400 naming it');
console.log('ok');
