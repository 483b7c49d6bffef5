// Tool calls and structured output with `kvchat-cli serve` through three client libraries as an
// application uses them: the official `openai` package, the Vercel AI SDK (`ai` with
// `@ai-sdk/openai-compatible`) and LangChain (`@langchain/openai`), with zod schemas where the library takes them.
// Usage: node openai_agent_clients.mjs PACKAGE_DIR BASE_URL MODEL
// PACKAGE_DIR holds node_modules with the packages (tests/common/npm_clients.h installs them).
// Prints one JSON line with every result: {"openai": {"tools": {...}, ...}, "ai_sdk": {...}, "langchain": {...}}.
// Each scenario runs on its own: one that throws is reported as {"error": ..., "status": ..., "body": ...} in
// that line, the error also goes to stderr, and the exit status is then 1.
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const [packageDir, baseURL, model] = process.argv.slice(2);
if (!packageDir || !baseURL || !model) {
  process.stderr.write("usage: node openai_agent_clients.mjs PACKAGE_DIR BASE_URL MODEL\n");
  process.exit(2);
}
const modules = path.join(path.resolve(packageDir), "node_modules");

// Imports `name` (or its `subpath` export) from PACKAGE_DIR by the ES module entry its package.json names.
// Node resolves bare names from this script's folder, which has no node_modules. A require() made with
// createRequire(PACKAGE_DIR) would take the CommonJS builds of zod and LangChain while `ai` and
// `@ai-sdk/openai-compatible`, ES modules only, import the ES builds (two zods), and it loads ES modules only from
// Node 20.19 and 22.12 on. Loaded as ES modules here, each package exists once, as the libraries import it.
async function load(name, subpath = ".") {
  const dir = path.join(modules, name);
  const manifest = JSON.parse(fs.readFileSync(path.join(dir, "package.json"), "utf8"));
  let entry = manifest.exports ? manifest.exports[subpath] : undefined;
  if (entry === undefined && subpath === ".") entry = manifest.module ?? manifest.main;
  while (entry !== null && typeof entry === "object") entry = entry.import ?? entry.default;
  if (typeof entry !== "string") throw new Error(`${name}: no ES module entry for ${subpath}`);
  return import(pathToFileURL(path.join(dir, entry)).href);
}

const OpenAI = (await load("openai")).default;
const { z } = await load("zod");
const ai = await load("ai");
const { createOpenAICompatible } = await load("@ai-sdk/openai-compatible");
const { ChatOpenAI } = await load("@langchain/openai");
const { HumanMessage } = await load("@langchain/core", "./messages");
const { tool: langchainTool } = await load("@langchain/core", "./tools");

const versionOf = (name) => JSON.parse(fs.readFileSync(path.join(modules, name, "package.json"), "utf8")).version;

const question = "What is the weather in Paris?";
const forcedTokens = 400;  // room for a whole forced call or JSON value
const textTokens = 8;      // free text from a random model: a few words are enough

// The tool every client offers, and what the application runs when the model calls it.
const weatherDescription = "Get the current weather for a city";
const weatherParameters = {
  type: "object",
  properties: {
    location: { type: "string", enum: ["Paris", "Z\u00fcrich"] },
    unit: { type: "string", enum: ["celsius", "fahrenheit"] },
  },
  required: ["location", "unit"],
  additionalProperties: false,
};
const weatherInput = z.strictObject({ location: z.enum(["Paris", "Z\u00fcrich"]), unit: z.enum(["celsius", "fahrenheit"]) });
function getWeather({ location, unit }) {
  return { location, temperature: unit === "celsius" ? 21 : 70, sky: "clear" };
}

// The structured output every client asks for.
const forecastSchema = {
  type: "object",
  properties: {
    city: { type: "string", enum: ["Paris", "Z\u00fcrich"] },
    temperature: { type: "integer", minimum: -30, maximum: 45 },
    sunny: { type: "boolean" },
  },
  required: ["city", "temperature", "sunny"],
  additionalProperties: false,
};
const forecastZod = z.strictObject({
  city: z.enum(["Paris", "Z\u00fcrich"]),
  temperature: z.number().int().min(-30).max(45),
  sunny: z.boolean(),
});
const forecastQuestion = "Give the forecast for Paris as JSON.";

// ---- openai ---------------------------------------------------------------------------------------------------

const openai = new OpenAI({ baseURL, apiKey: "none", maxRetries: 0 });
const weatherTool = {
  type: "function",
  function: { name: "get_weather", description: weatherDescription, parameters: weatherParameters },
};
const forceWeather = { type: "function", function: { name: "get_weather" } };
const callOf = (call) => ({ id: call.id, type: call.type, name: call.function.name, arguments: call.function.arguments });

// (a) Two steps, whole replies: the forced call, the function run on its arguments, the result sent back.
async function openaiTools() {
  const messages = [{ role: "user", content: question }];
  const first = await openai.chat.completions.create({
    model, messages, tools: [weatherTool], tool_choice: forceWeather, temperature: 0, max_tokens: forcedTokens,
  });
  const message = first.choices[0].message;
  const call = message.tool_calls[0];
  const output = getWeather(JSON.parse(call.function.arguments));
  const second = await openai.chat.completions.create({
    model,
    messages: [
      ...messages,
      { role: "assistant", content: message.content, tool_calls: message.tool_calls },
      { role: "tool", tool_call_id: call.id, content: JSON.stringify(output) },
    ],
    tools: [weatherTool], temperature: 0, max_tokens: textTokens,
  });
  return {
    finish_reason: first.choices[0].finish_reason,
    content: message.content,
    tool_calls: message.tool_calls.map(callOf),
    tool_output: output,
    final: second.choices[0].message.content,
    final_finish_reason: second.choices[0].finish_reason,
    usage: [first.usage, second.usage],
  };
}

// (b) The same two steps streamed, each reply assembled by the SDK's ChatCompletionStream.
async function openaiStreamedTools() {
  const messages = [{ role: "user", content: question }];
  const first = openai.chat.completions.stream({
    model, messages, tools: [weatherTool], tool_choice: forceWeather, temperature: 0, max_tokens: forcedTokens,
  });
  let argumentsDone = 0;
  first.on("tool_calls.function.arguments.done", () => ++argumentsDone);
  const completion = await first.finalChatCompletion();
  const message = completion.choices[0].message;
  const call = message.tool_calls[0];
  const output = getWeather(JSON.parse(call.function.arguments));
  const second = openai.chat.completions.stream({
    model,
    messages: [
      ...messages,
      { role: "assistant", content: message.content, tool_calls: message.tool_calls },
      { role: "tool", tool_call_id: call.id, content: JSON.stringify(output) },
    ],
    tools: [weatherTool], temperature: 0, max_tokens: textTokens,
  });
  return {
    finish_reason: completion.choices[0].finish_reason,
    content: message.content,
    tool_calls: message.tool_calls.map(callOf),
    arguments_done_events: argumentsDone,
    tool_output: output,
    final: await second.finalContent(),
  };
}

// (b') runTools, streamed: the helper runs the function itself; a forced function ends the run after its call.
async function openaiRunTools() {
  const inputs = [];
  const runner = openai.chat.completions.runTools({
    model, messages: [{ role: "user", content: question }], stream: true, temperature: 0, max_tokens: forcedTokens,
    tool_choice: forceWeather,
    tools: [{
      type: "function",
      function: {
        name: "get_weather", description: weatherDescription, parameters: weatherParameters, parse: JSON.parse,
        function: (input) => { inputs.push(input); return getWeather(input); },
      },
    }],
  });
  await runner.done();
  return {
    function_inputs: inputs,
    messages: runner.messages.map((m) => ({
      role: m.role, content: m.content ?? null, tool_calls: m.tool_calls?.map(callOf), tool_call_id: m.tool_call_id,
    })),
  };
}

// (c) response_format json_schema, strict.
async function openaiJsonSchema() {
  const reply = await openai.chat.completions.create({
    model, messages: [{ role: "user", content: forecastQuestion }], temperature: 0, max_tokens: forcedTokens,
    response_format: { type: "json_schema", json_schema: { name: "forecast", strict: true, schema: forecastSchema } },
  });
  const text = reply.choices[0].message.content;
  return { finish_reason: reply.choices[0].finish_reason, text, value: JSON.parse(text) };
}

// (d) Log probabilities of the chosen tokens and of the two most likely ones at each step.
async function openaiLogprobs() {
  const reply = await openai.chat.completions.create({
    model, messages: [{ role: "user", content: question }], temperature: 0, max_tokens: textTokens, logprobs: true,
    top_logprobs: 2,
  });
  return {
    question,
    prompt_tokens: reply.usage.prompt_tokens,
    text: reply.choices[0].message.content,
    content: reply.choices[0].logprobs.content.map((entry) => ({
      token: entry.token,
      bytes: entry.bytes,
      logprob: entry.logprob,
      top_logprobs: entry.top_logprobs.map((top) => ({ token: top.token, bytes: top.bytes, logprob: top.logprob })),
    })),
  };
}

// ---- Vercel AI SDK --------------------------------------------------------------------------------------------

const provider = createOpenAICompatible({
  name: "kvchat", baseURL, apiKey: "none", supportsStructuredOutputs: true, includeUsage: true,
});
const chatModel = provider.chatModel(model);
const executedByAiSdk = [];
const aiSdkTools = {
  get_weather: ai.tool({
    description: weatherDescription,
    inputSchema: weatherInput,
    execute: async (input) => { executedByAiSdk.push(input); return getWeather(input); },
  }),
};
const aiSdkToolRun = {
  model: chatModel, tools: aiSdkTools, prompt: question, temperature: 0, maxOutputTokens: forcedTokens, maxRetries: 0,
  stopWhen: ai.isStepCount(2),
  // The first step must call get_weather; the second answers in text, with the tool's result.
  prepareStep: ({ stepNumber }) => stepNumber === 0
    ? { toolChoice: { type: "tool", toolName: "get_weather" } }
    : { toolChoice: "none", maxOutputTokens: textTokens },
};
const stepOf = (step) => ({
  finish_reason: step.finishReason,
  tool_calls: step.toolCalls.map((call) => ({ id: call.toolCallId, name: call.toolName, input: call.input })),
  tool_results: step.toolResults.map((result) => ({ id: result.toolCallId, name: result.toolName, output: result.output })),
  text: step.text,
  input_tokens: step.usage.inputTokens,
  output_tokens: step.usage.outputTokens,
});

// (a) generateText: the forced call run by the SDK, then the answer.
async function aiSdkGenerateText() {
  executedByAiSdk.length = 0;
  const result = await ai.generateText(aiSdkToolRun);
  return { steps: result.steps.map(stepOf), text: result.text, executed: [...executedByAiSdk] };
}

// (b) streamText, its full stream read to the end.
async function aiSdkStreamText() {
  executedByAiSdk.length = 0;
  let failure;
  const result = ai.streamText({ ...aiSdkToolRun, onError: ({ error }) => { failure ??= error; } });
  const parts = {};
  const calls = [];
  for await (const part of result.fullStream) {
    parts[part.type] = (parts[part.type] ?? 0) + 1;
    if (part.type === "tool-call") calls.push({ id: part.toolCallId, name: part.toolName, input: part.input });
    if (part.type === "error") failure ??= part.error;
  }
  if (failure) throw failure;
  return {
    steps: (await result.steps).map(stepOf), text: await result.text, tool_call_parts: calls, part_counts: parts,
    executed: [...executedByAiSdk],
  };
}

// (c) Structured output: generateText with Output.object, and generateObject (deprecated in v7 for the former).
async function aiSdkOutputObject() {
  const result = await ai.generateText({
    model: chatModel, prompt: forecastQuestion, temperature: 0, maxOutputTokens: forcedTokens, maxRetries: 0,
    output: ai.Output.object({ schema: forecastZod, name: "forecast" }),
  });
  return { text: result.text, value: result.output };
}
async function aiSdkGenerateObject() {
  const result = await ai.generateObject({
    model: chatModel, prompt: forecastQuestion, temperature: 0, maxOutputTokens: forcedTokens, maxRetries: 0,
    schema: forecastZod, schemaName: "forecast",
  });
  return { value: result.object };
}

// ---- LangChain ------------------------------------------------------------------------------------------------

const langchainSettings = { model, apiKey: "none", configuration: { baseURL }, temperature: 0, maxRetries: 0 };
const forcedChat = new ChatOpenAI({ ...langchainSettings, maxTokens: forcedTokens });
const textChat = new ChatOpenAI({ ...langchainSettings, maxTokens: textTokens });

// (a) bindTools forcing get_weather, the tool run by LangChain on the call, its ToolMessage sent back unforced.
// Streamed: each reply is read with .stream() and its chunks joined with concat, which assembles the call from
// its tool_call_chunks as an application streaming a LangChain agent does.
async function reply(chat, messages, streamed) {
  if (!streamed) return chat.invoke(messages);
  let whole;
  for await (const chunk of await chat.stream(messages)) whole = whole === undefined ? chunk : whole.concat(chunk);
  return whole;
}
async function langchainTools(streamed) {
  const executed = [];
  const weather = langchainTool(
    async (input) => { executed.push(input); return JSON.stringify(getWeather(input)); },
    { name: "get_weather", description: weatherDescription, schema: weatherInput });
  const messages = [new HumanMessage(question)];
  const called = await reply(forcedChat.bindTools([weather], { tool_choice: "get_weather" }), messages, streamed);
  const toolMessage = await weather.invoke(called.tool_calls[0]);
  const answered = await reply(textChat.bindTools([weather]), [...messages, called, toolMessage], streamed);
  return {
    content: called.content,
    tool_calls: called.tool_calls.map((call) => ({ id: call.id, name: call.name, args: call.args })),
    tool_message: { tool_call_id: toolMessage.tool_call_id, name: toolMessage.name, content: toolMessage.content },
    executed,
    final: answered.content,
    final_tool_calls: answered.tool_calls.length,
    usage: [called.usage_metadata, answered.usage_metadata],
  };
}

// (b) withStructuredOutput through response_format json_schema.
async function langchainStructured() {
  const value = await forcedChat.withStructuredOutput(forecastZod, { method: "jsonSchema", name: "forecast" })
    .invoke(forecastQuestion);
  return { value };
}

// ---- run ------------------------------------------------------------------------------------------------------

const scenarios = {
  openai: {
    tools: openaiTools, streamed_tools: openaiStreamedTools, run_tools: openaiRunTools, json_schema: openaiJsonSchema,
    logprobs: openaiLogprobs,
  },
  ai_sdk: {
    generate_text: aiSdkGenerateText, stream_text: aiSdkStreamText, output_object: aiSdkOutputObject,
    generate_object: aiSdkGenerateObject,
  },
  langchain: {
    tools: () => langchainTools(false), streamed_tools: () => langchainTools(true), structured: langchainStructured,
  },
};
const versions = {
  openai: versionOf("openai"), ai: versionOf("ai"), "@ai-sdk/openai-compatible": versionOf("@ai-sdk/openai-compatible"),
  zod: versionOf("zod"), "@langchain/openai": versionOf("@langchain/openai"), "@langchain/core": versionOf("@langchain/core"),
};

// What a failed scenario reports: the message, and the HTTP status and body when the server refused a request
// (openai's APIError and LangChain's wrap of it: status and error; the AI SDK's APICallError: statusCode and
// responseBody, possibly as the cause of its own error).
function failureOf(error) {
  const failure = { error: String(error?.message ?? error) };
  for (let cause = error; cause; cause = cause.cause) {
    const status = cause.status ?? cause.statusCode;
    if (status !== undefined) {
      failure.status = status;
      failure.body = cause.error ?? cause.responseBody;
      break;
    }
  }
  return failure;
}

const result = { versions };
let failed = false;
for (const [client, runs] of Object.entries(scenarios)) {
  result[client] = {};
  for (const [name, run] of Object.entries(runs)) {
    try {
      result[client][name] = await run();
    } catch (error) {
      failed = true;
      result[client][name] = failureOf(error);
      process.stderr.write(`${client}.${name}: ${error?.stack ?? error}\n${JSON.stringify(result[client][name])}\n`);
    }
  }
}
console.log(JSON.stringify(result));
process.exit(failed ? 1 : 0);
