// One AI SDK case, run by run.mjs as its own process: a provider (anthropic, openai-chat or
// openai-responses) with a tool, reasoning asked for, through the gateway; prints the final text.
// Usage: node aisdk.mjs <provider> <generate|stream> <token>
import { generateText, jsonSchema, stepCountIs, streamText, tool } from "ai";
import { createAnthropic } from "@ai-sdk/anthropic";
import { createOpenAI } from "@ai-sdk/openai";

const [provider, mode, tok] = process.argv.slice(2);
const baseURL = `${process.env.GATEWAY_URL}/v1`;
const apiKey = process.env.GATEWAY_KEY;

let ran = false;
const compute = tool({
  description: "Adds two numbers and returns the check value.",
  inputSchema: jsonSchema({
    type: "object",
    properties: { a: { type: "number" }, b: { type: "number" } },
    required: ["a", "b"],
    additionalProperties: false,
  }),
  execute: async ({ a, b }) => {
    ran = true;
    return `mg-${a + b}-${tok}`;
  },
});

let model;
let providerOptions;
if (provider === "anthropic") {
  model = createAnthropic({ baseURL, apiKey })("claude-sonnet-4-5");
  providerOptions = { anthropic: { thinking: { type: "enabled", budgetTokens: 1024 } } };
} else if (provider === "openai-chat") {
  model = createOpenAI({ baseURL, apiKey }).chat("gpt-5.5");
  providerOptions = { openai: { reasoningEffort: "low" } };
} else {
  model = createOpenAI({ baseURL, apiKey }).responses("gpt-5.5");
  providerOptions = { openai: { reasoningEffort: "low", reasoningSummary: "auto" } };
  // The default `store: true`: the SDK sends the first turn's items back as `item_reference`s,
  // which the gateway resolves from its own store toward chat and messages upstreams and leaves
  // to a responses upstream (gateway.md §13).
}

const args = {
  model,
  tools: { compute },
  stopWhen: stepCountIs(4),
  maxOutputTokens: 4096,
  providerOptions,
  prompt: `Compute the check value for ${tok} with the compute tool, then report it.`,
};

let text;
if (mode === "stream") {
  const result = streamText({ ...args, onError: ({ error }) => { throw error; } });
  text = "";
  for await (const part of result.textStream) text += part;
} else {
  text = (await generateText(args)).text;
}
if (!ran) {
  console.error("the compute tool never ran");
  process.exit(2);
}
console.log(text);
