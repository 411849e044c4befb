// A scripted loopback upstream for the agents suite: it speaks chat, messages and responses on
// one port. A request that declares the case's tool and has no tool result yet is answered with
// a call to that tool; once a tool result is in the conversation, with the final text. Requests
// that declare none of the tools (titles, side queries) get a short plain answer.
import http from "node:http";

const TOKEN = /mgtok[0-9a-z]{8}/;

/// What each case's tool call looks like; `check` is what its result must contain.
export function toolCall(name, tok) {
  switch (name) {
    case "Bash":
      // The arithmetic proves the command ran: "mg-42-" is not in the command itself.
      return { args: { command: `echo mg-$((40+2))-${tok}`, description: "Print the check value" } };
    case "apply_patch":
      return { input: `*** Begin Patch\n*** Add File: mg-${tok}.txt\n+mg-42-${tok}\n*** End Patch\n` };
    case "compute":
      return { args: { a: 40, b: 2 } };
    case "exec_command":
      return { args: { cmd: `echo mg-$((40+2))-${tok}` } };
    default:
      return null;
  }
}

// In this order: Codex declares both apply_patch and exec_command where its model has the former.
const CASE_TOOLS = ["Bash", "apply_patch", "compute", "exec_command"];

function declaredTools(proto, body) {
  const out = new Map();
  for (const t of body.tools ?? []) {
    if (proto === "chat") out.set(t.function?.name, "function");
    else if (proto === "messages") out.set(t.name, "function");
    else if (t.type === "namespace") for (const i of t.tools ?? []) out.set(`${t.name}__${i.name}`, i.type);
    else out.set(t.name, t.type);
  }
  return out;
}

/// The text of every tool result in the conversation, or null when there is none.
function toolResults(proto, body) {
  const texts = [];
  const flat = (c) => (typeof c === "string" ? c : JSON.stringify(c ?? ""));
  if (proto === "chat") {
    for (const m of body.messages ?? []) if (m.role === "tool") texts.push(flat(m.content));
  } else if (proto === "messages") {
    for (const m of body.messages ?? [])
      if (Array.isArray(m.content))
        for (const b of m.content) if (b.type === "tool_result") texts.push(flat(b.content));
  } else if (Array.isArray(body.input)) {
    for (const i of body.input) if (i.type?.endsWith("_call_output")) texts.push(flat(i.output));
  }
  return texts.length ? texts.join("\n") : null;
}

/// The reply as protocol-neutral steps: reasoning, then text or one tool call.
function plan(proto, body, seen) {
  const tok = (JSON.stringify(body).match(TOKEN) ?? ["none"])[0];
  const tools = declaredTools(proto, body);
  const results = toolResults(proto, body);
  const name = CASE_TOOLS.find((n) => tools.has(n));
  if (!name) return { tok, reasoning: null, text: "ok" };
  if (results !== null) {
    seen.push({ tok, tool: name, results });
    return { tok, reasoning: "The tool answered; reporting.", text: `FINAL-${tok}: the check passed.` };
  }
  const call = toolCall(name, tok);
  const custom = tools.get(name) === "custom";
  const id = `call_${tok}_${seen.length}`;
  return {
    tok,
    reasoning: `I should call ${name}.`,
    call: {
      id,
      name,
      custom,
      input: call.input,
      // Toward a function the custom tool's input is the string argument `input`.
      arguments: JSON.stringify(call.args ?? { input: call.input }),
    },
  };
}

const usage = { input_tokens: 12, output_tokens: 7 };

function chatReply(p, model, stream) {
  const id = `chatcmpl-${p.tok}`;
  const created = Math.floor(Date.now() / 1000);
  const toolCalls = p.call
    ? [{ id: p.call.id, type: "function", function: { name: p.call.name, arguments: p.call.arguments } }]
    : undefined;
  const finish = p.call ? "tool_calls" : "stop";
  const u = { prompt_tokens: 12, completion_tokens: 7, total_tokens: 19 };
  if (!stream) {
    return json({ id, object: "chat.completion", created, model, usage: u,
      choices: [{ index: 0, finish_reason: finish,
        message: { role: "assistant", content: p.text ?? null, reasoning_content: p.reasoning ?? undefined, tool_calls: toolCalls } }] });
  }
  const chunk = (delta, finish_reason = null) =>
    `data: ${JSON.stringify({ id, object: "chat.completion.chunk", created, model, choices: [{ index: 0, delta, finish_reason }] })}\n\n`;
  const out = [chunk({ role: "assistant", content: "" })];
  if (p.reasoning) out.push(chunk({ reasoning_content: p.reasoning }));
  if (p.text) {
    out.push(chunk({ content: p.text.slice(0, 6) }), chunk({ content: p.text.slice(6) }));
  }
  if (p.call) {
    const a = p.call.arguments;
    out.push(chunk({ tool_calls: [{ index: 0, id: p.call.id, type: "function", function: { name: p.call.name, arguments: "" } }] }));
    out.push(chunk({ tool_calls: [{ index: 0, function: { arguments: a.slice(0, 10) } }] }));
    out.push(chunk({ tool_calls: [{ index: 0, function: { arguments: a.slice(10) } }] }));
  }
  out.push(chunk({}, finish));
  out.push(`data: ${JSON.stringify({ id, object: "chat.completion.chunk", created, model, choices: [], usage: u })}\n\n`);
  out.push("data: [DONE]\n\n");
  return sse(out);
}

function messagesReply(p, model, stream) {
  const id = `msg_${p.tok}`;
  const content = [];
  if (p.reasoning) content.push({ type: "thinking", thinking: p.reasoning, signature: "sig-scripted" });
  if (p.text) content.push({ type: "text", text: p.text });
  if (p.call) content.push({ type: "tool_use", id: `toolu_${p.tok}`, name: p.call.name, input: JSON.parse(p.call.arguments) });
  const stop = p.call ? "tool_use" : "end_turn";
  if (!stream) {
    return json({ id, type: "message", role: "assistant", model, content, stop_reason: stop, stop_sequence: null, usage });
  }
  const ev = (o) => `event: ${o.type}\ndata: ${JSON.stringify(o)}\n\n`;
  const out = [ev({ type: "message_start", message: { id, type: "message", role: "assistant", model, content: [], stop_reason: null, stop_sequence: null, usage: { input_tokens: 12, output_tokens: 0 } } })];
  content.forEach((b, index) => {
    if (b.type === "thinking") {
      out.push(ev({ type: "content_block_start", index, content_block: { type: "thinking", thinking: "", signature: "" } }));
      out.push(ev({ type: "content_block_delta", index, delta: { type: "thinking_delta", thinking: b.thinking } }));
      out.push(ev({ type: "content_block_delta", index, delta: { type: "signature_delta", signature: b.signature } }));
    } else if (b.type === "text") {
      out.push(ev({ type: "content_block_start", index, content_block: { type: "text", text: "" } }));
      out.push(ev({ type: "content_block_delta", index, delta: { type: "text_delta", text: b.text } }));
    } else {
      out.push(ev({ type: "content_block_start", index, content_block: { type: "tool_use", id: b.id, name: b.name, input: {} } }));
      out.push(ev({ type: "content_block_delta", index, delta: { type: "input_json_delta", partial_json: JSON.stringify(b.input) } }));
    }
    out.push(ev({ type: "content_block_stop", index }));
  });
  out.push(ev({ type: "message_delta", delta: { stop_reason: stop, stop_sequence: null }, usage: { output_tokens: 7 } }));
  out.push(ev({ type: "message_stop" }));
  return sse(out);
}

function responsesReply(p, model, stream) {
  const id = `resp_${p.tok}${Date.now()}`;
  const output = [];
  if (p.reasoning) output.push({ type: "reasoning", id: `rs_${p.tok}${output.length}`, summary: [{ type: "summary_text", text: p.reasoning }] });
  if (p.text) output.push({ type: "message", id: `msg_${p.tok}`, status: "completed", role: "assistant", content: [{ type: "output_text", text: p.text, annotations: [] }] });
  if (p.call && p.call.custom) output.push({ type: "custom_tool_call", id: `ctc_${p.tok}`, call_id: p.call.id, name: p.call.name, input: p.call.input, status: "completed" });
  else if (p.call) output.push({ type: "function_call", id: `fc_${p.tok}`, call_id: p.call.id, name: p.call.name, arguments: p.call.arguments, status: "completed" });
  const u = { input_tokens: 12, input_tokens_details: { cached_tokens: 0 }, output_tokens: 7, output_tokens_details: { reasoning_tokens: 2 }, total_tokens: 19 };
  const response = (status, out, usage) => ({ id, object: "response", created_at: Math.floor(Date.now() / 1000), status, model, output: out, usage, error: null, incomplete_details: null, tools: [], tool_choice: "auto", parallel_tool_calls: true });
  if (!stream) return json(response("completed", output, u));
  let seq = 0;
  const ev = (o) => `event: ${o.type}\ndata: ${JSON.stringify({ ...o, sequence_number: seq++ })}\n\n`;
  const out = [ev({ type: "response.created", response: response("in_progress", [], null) })];
  output.forEach((item, output_index) => {
    if (item.type === "message") {
      out.push(ev({ type: "response.output_item.added", output_index, item: { ...item, status: "in_progress", content: [] } }));
      out.push(ev({ type: "response.content_part.added", item_id: item.id, output_index, content_index: 0, part: { type: "output_text", text: "", annotations: [] } }));
      out.push(ev({ type: "response.output_text.delta", item_id: item.id, output_index, content_index: 0, delta: item.content[0].text, logprobs: [] }));
      out.push(ev({ type: "response.output_text.done", item_id: item.id, output_index, content_index: 0, text: item.content[0].text, logprobs: [] }));
      out.push(ev({ type: "response.content_part.done", item_id: item.id, output_index, content_index: 0, part: item.content[0] }));
    } else if (item.type === "reasoning") {
      out.push(ev({ type: "response.output_item.added", output_index, item: { ...item, summary: [] } }));
      out.push(ev({ type: "response.reasoning_summary_part.added", item_id: item.id, output_index, summary_index: 0, part: { type: "summary_text", text: "" } }));
      out.push(ev({ type: "response.reasoning_summary_text.delta", item_id: item.id, output_index, summary_index: 0, delta: p.reasoning }));
      out.push(ev({ type: "response.reasoning_summary_text.done", item_id: item.id, output_index, summary_index: 0, text: p.reasoning }));
      out.push(ev({ type: "response.reasoning_summary_part.done", item_id: item.id, output_index, summary_index: 0, part: { type: "summary_text", text: p.reasoning } }));
    } else if (item.type === "function_call") {
      out.push(ev({ type: "response.output_item.added", output_index, item: { ...item, arguments: "", status: "in_progress" } }));
      out.push(ev({ type: "response.function_call_arguments.delta", item_id: item.id, output_index, delta: item.arguments }));
      out.push(ev({ type: "response.function_call_arguments.done", item_id: item.id, output_index, name: item.name, arguments: item.arguments }));
    } else {
      out.push(ev({ type: "response.output_item.added", output_index, item: { ...item, input: "", status: "in_progress" } }));
      out.push(ev({ type: "response.custom_tool_call_input.delta", item_id: item.id, output_index, delta: item.input }));
      out.push(ev({ type: "response.custom_tool_call_input.done", item_id: item.id, output_index, input: item.input }));
    }
    out.push(ev({ type: "response.output_item.done", output_index, item }));
  });
  out.push(ev({ type: "response.completed", response: response("completed", output, u) }));
  return sse(out);
}

const json = (o) => ({ type: "application/json", body: JSON.stringify(o) });
const sse = (frames) => ({ type: "text/event-stream", frames });

/// Starts the upstream on a loopback port; `seen` collects the tool results each case reached.
export async function startUpstream() {
  const seen = [];
  const requests = [];
  const server = http.createServer((req, res) => {
    let data = "";
    req.on("data", (c) => (data += c));
    req.on("end", () => {
      let body = {};
      try {
        body = JSON.parse(data || "{}");
      } catch {
        body = {};
      }
      const path = req.url.split("?")[0];
      requests.push({ path, body });
      const proto = path.endsWith("/chat/completions") ? "chat"
        : path.endsWith("/messages/count_tokens") ? "count"
        : path.endsWith("/messages") ? "messages"
        : path.endsWith("/responses") ? "responses" : null;
      if (proto === "count") {
        res.writeHead(200, { "content-type": "application/json" });
        return res.end(JSON.stringify({ input_tokens: 99 }));
      }
      if (!proto || req.method !== "POST") {
        res.writeHead(404, { "content-type": "application/json" });
        return res.end(JSON.stringify({ error: { message: `no such path ${req.url}`, type: "not_found" } }));
      }
      const p = plan(proto, body, seen);
      const model = body.model ?? "scripted";
      const reply = proto === "chat" ? chatReply(p, model, !!body.stream)
        : proto === "messages" ? messagesReply(p, model, !!body.stream)
        : responsesReply(p, model, !!body.stream);
      res.writeHead(200, { "content-type": reply.type });
      if (reply.body !== undefined) return res.end(reply.body);
      // Frames go out one by one, as a real upstream streams them.
      let i = 0;
      const next = () => {
        if (i >= reply.frames.length) return res.end();
        res.write(reply.frames[i++]);
        setImmediate(next);
      };
      next();
    });
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  return { port: server.address().port, seen, requests, close: () => server.close() };
}
