// A 3-turn conversation with `kvchat-cli serve` through the official `openai` npm package, once whole and
// once streamed. Usage: node openai_client.mjs PACKAGE_DIR BASE_URL API_KEY MODEL
// Prints one JSON line: {"whole": {"texts": [...], "cached": [...]}, "streamed": {...}}.
import { createRequire } from "node:module";
import path from "node:path";

const [packageDir, baseURL, apiKey, model] = process.argv.slice(2);
const require = createRequire(path.join(path.resolve(packageDir), "node_modules", "index.js"));
const OpenAI = require("openai");
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });

const userTurns = ["Once upon a time", " The cat said", " Then the dog"];

async function whole() {
  const messages = [], texts = [], cached = [];
  for (const turn of userTurns) {
    messages.push({ role: "user", content: turn });
    const reply = await client.chat.completions.create({ model, messages, temperature: 0, max_tokens: 24 });
    const text = reply.choices[0].message.content;
    texts.push(text);
    cached.push(reply.usage.prompt_tokens_details.cached_tokens);
    messages.push({ role: "assistant", content: text });
  }
  return { texts, cached };
}

async function streamed() {
  const messages = [], texts = [], cached = [];
  for (const turn of userTurns) {
    messages.push({ role: "user", content: turn });
    const stream = await client.chat.completions.create({
      model, messages, temperature: 0, max_tokens: 24, stream: true, stream_options: { include_usage: true },
    });
    let text = "", usage = null;
    for await (const chunk of stream) {
      if (chunk.choices.length > 0 && chunk.choices[0].delta.content) text += chunk.choices[0].delta.content;
      if (chunk.usage) usage = chunk.usage;
    }
    texts.push(text);
    cached.push(usage ? usage.prompt_tokens_details.cached_tokens : -1);
    messages.push({ role: "assistant", content: text });
  }
  return { texts, cached };
}

const result = { whole: await whole(), streamed: await streamed() };
console.log(JSON.stringify(result));
