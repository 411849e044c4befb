// The real agent clients through the real gateway binary (issue 9, gateway.md §13): Claude Code,
// Codex and the AI SDK's three providers, each against a gateway whose one upstream is the
// scripted loopback upstream of upstream.mjs speaking chat, messages or responses. A case passes
// when the client exits 0, its tool really ran (the upstream saw the result only a run produces,
// or the file it wrote exists) and the final text reached the client.
//
// Usage: node run.mjs [filter]   (MODELGATE_BIN: the binary; default ../../target/debug/modelgate)
import { spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { startUpstream } from "./upstream.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const bin = process.env.MODELGATE_BIN ?? path.resolve(here, "../../target/debug/modelgate");
const filter = process.argv[2] ?? "";
const KEY = "sk-agents-e2e";
const CASE_TIMEOUT_MS = 180_000;
const scratch = fs.mkdtempSync(path.join(os.tmpdir(), "modelgate-agents-"));

const token = () => `mgtok${Math.random().toString(36).slice(2, 10).padEnd(8, "0")}`;

/// Starts `modelgate serve` on a config naming one upstream of `kind`; resolves to its base URL.
function startGateway(kind, upstreamPort) {
  const thinking = { chat: "none", messages: "anthropic", responses: "openai" }[kind];
  const config = `
[listen]
base = "127.0.0.1:0"

[[keys]]
name = "agents"
key = "${KEY}"

[[upstreams]]
name = "scripted-${kind}"
kind = "${kind}"
base_url = "http://127.0.0.1:${upstreamPort}/v1"
api_key_env = "AGENTS_UPSTREAM_KEY"

[[models]]
name = "*"
upstream = "scripted-${kind}"
default_max_tokens = 4096
# chat: the case the issue names, a model with no thinking form (agents' thinking is dropped).
thinking = "${thinking}"
`;
  const file = path.join(scratch, `gateway-${kind}.toml`);
  fs.writeFileSync(file, config);
  const log = fs.openSync(path.join(scratch, `gateway-${kind}.log`), "w");
  const child = spawn(bin, ["serve", "--config", file], {
    env: { ...process.env, AGENTS_UPSTREAM_KEY: "up-key", RUST_LOG: "info", NO_COLOR: "1" },
    stdio: ["ignore", log, "pipe"],
  });
  return new Promise((resolve, reject) => {
    let err = "";
    const timer = setTimeout(() => reject(new Error(`gateway ${kind} did not start:\n${err}`)), 30_000);
    child.stderr.on("data", (d) => {
      err += d;
      fs.appendFileSync(path.join(scratch, `gateway-${kind}.log`), d);
      const m = err.match(/listening on (https?):\/\/(\S+) listener="?base"?/);
      if (m) {
        clearTimeout(timer);
        resolve({ kind, url: `${m[1]}://${m[2]}`, child });
      }
    });
    child.on("exit", (code) => reject(new Error(`gateway ${kind} exited ${code}:\n${err}`)));
  });
}

/// Runs a client to its end; resolves to its exit code and output, never rejects.
function run(cmd, args, opts) {
  return new Promise((resolve) => {
    const child = spawn(cmd, args, { ...opts, stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    let err = "";
    child.stdout.on("data", (d) => (out += d));
    child.stderr.on("data", (d) => (err += d));
    const timer = setTimeout(() => child.kill("SIGKILL"), CASE_TIMEOUT_MS);
    child.on("error", (e) => {
      clearTimeout(timer);
      resolve({ code: -1, out, err: err + String(e) });
    });
    child.on("exit", (code, signal) => {
      clearTimeout(timer);
      resolve({ code: signal ? `killed (${signal}) after ${CASE_TIMEOUT_MS} ms` : code, out, err });
    });
  });
}

const nodeBin = (name) => path.join(here, "node_modules", ".bin", name);

/// A clean environment for a CLI: no credentials or settings of the machine leak in.
function cleanEnv(extra) {
  const keep = ["PATH", "LANG", "TERM", "TMPDIR", "SHELL"];
  const env = {};
  for (const k of keep) if (process.env[k]) env[k] = process.env[k];
  return { ...env, NO_COLOR: "1", ...extra };
}

function claude(gw, prompt, extra = []) {
  const home = fs.mkdtempSync(path.join(scratch, "claude-home-"));
  const cwd = fs.mkdtempSync(path.join(scratch, "claude-cwd-"));
  return run(
    nodeBin("claude"),
    ["-p", prompt, "--model", "claude-sonnet-4-5", ...extra],
    {
      cwd,
      env: cleanEnv({
        HOME: home,
        ANTHROPIC_BASE_URL: gw.url,
        ANTHROPIC_API_KEY: KEY,
        DISABLE_TELEMETRY: "1",
        DISABLE_ERROR_REPORTING: "1",
        DISABLE_AUTOUPDATER: "1",
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: "1",
        CLAUDE_CODE_DISABLE_TERMINAL_TITLE: "1",
      }),
    },
  );
}

async function claudeCode(gw, upstream) {
  const tok = token();
  const r = await claude(gw, `Run the check command for ${tok} with the Bash tool and report.`,
    ["--allowedTools", "Bash", "--max-turns", "4", "--output-format", "text"]);
  return verdict(r, tok, upstream, "Bash", `mg-42-${tok}`);
}

/// `/context` counts its context with `POST /v1/messages/count_tokens`: forwarded to a messages
/// upstream (whose scripted answer is 99 a call), estimated by the gateway for the others.
async function claudeContext(gw, upstream) {
  const r = await claude(gw, "/context");
  if (r.code !== 0) return { ok: false, why: `exit ${r.code}`, r };
  if (!r.out.includes("## Context Usage") || !/\| Messages \| [0-9.]+k? \|/.test(r.out)) {
    return { ok: false, why: "no context table with a message count", r };
  }
  const forwarded = upstream.requests.some((q) => q.path.endsWith("/messages/count_tokens"));
  if (gw.kind === "messages" && !forwarded) return { ok: false, why: "count_tokens never reached the messages upstream", r };
  return { ok: true };
}

/// `model`: gpt-5.5 makes Codex declare apply_patch (a custom tool with a grammar), tool_search
/// and web_search; gpt-5.2-codex, a namespace of sub-agent tools and exec_command instead.
async function codex(gw, upstream, model = "gpt-5.5") {
  const tok = token();
  const home = fs.mkdtempSync(path.join(scratch, "codex-home-"));
  const cwd = fs.mkdtempSync(path.join(scratch, "codex-cwd-"));
  // Codex's defaults plus one provider: the gateway, spoken to over the Responses API.
  fs.writeFileSync(
    path.join(home, "config.toml"),
    `model = "${model}"
model_provider = "modelgate"

[model_providers.modelgate]
name = "modelgate"
base_url = "${gw.url}/v1"
wire_api = "responses"
env_key = "MODELGATE_KEY"
`,
  );
  const r = await run(
    nodeBin("codex"),
    ["exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", "-C", cwd,
      `Create the check file for ${tok}.`],
    { cwd, env: cleanEnv({ HOME: home, CODEX_HOME: home, MODELGATE_KEY: KEY }) },
  );
  if (model !== "gpt-5.5") return verdict(r, tok, upstream, "exec_command", `mg-42-${tok}`);
  const v = verdict(r, tok, upstream, "apply_patch", null);
  const file = path.join(cwd, `mg-${tok}.txt`);
  const written = fs.existsSync(file) ? fs.readFileSync(file, "utf8") : null;
  if (v.ok && written?.trim() !== `mg-42-${tok}`) {
    return { ok: false, why: `apply_patch did not write ${file} (found ${JSON.stringify(written)})`, r };
  }
  return v;
}

async function aiSdk(gw, upstream, provider, stream) {
  const tok = token();
  const r = await run(process.execPath, [path.join(here, "aisdk.mjs"), provider, stream ? "stream" : "generate", tok], {
    cwd: here,
    env: cleanEnv({ GATEWAY_URL: gw.url, GATEWAY_KEY: KEY, UPSTREAM_KIND: gw.kind }),
  });
  return verdict(r, tok, upstream, "compute", `mg-42-${tok}`);
}

/// Exit 0, the tool's result reached the upstream (with `mustContain`), the final text reached the client.
function verdict(r, tok, upstream, tool, mustContain) {
  if (r.code !== 0) return { ok: false, why: `exit ${r.code}`, r };
  const hit = upstream.seen.find((s) => s.tok === tok && s.tool === tool);
  if (!hit) return { ok: false, why: `no ${tool} result reached the upstream`, r };
  if (mustContain && !hit.results.includes(mustContain)) {
    return { ok: false, why: `the ${tool} result lacks ${mustContain}: ${hit.results.slice(0, 300)}`, r };
  }
  if (!r.out.includes(`FINAL-${tok}`)) return { ok: false, why: "the final text did not reach the client", r };
  return { ok: true };
}

const upstream = await startUpstream();
const gateways = {};
for (const kind of ["chat", "messages", "responses"]) gateways[kind] = await startGateway(kind, upstream.port);

const cases = [];
for (const kind of ["chat", "responses", "messages"]) {
  cases.push([`claude-code via ${kind} upstream`, () => claudeCode(gateways[kind], upstream)]);
}
for (const kind of ["chat", "messages"]) {
  cases.push([`claude-code /context via ${kind} upstream`, () => claudeContext(gateways[kind], upstream)]);
}
for (const kind of ["chat", "responses"]) {
  cases.push([`codex via ${kind} upstream`, () => codex(gateways[kind], upstream)]);
  cases.push([`codex gpt-5.2-codex (namespace tools) via ${kind} upstream`,
    () => codex(gateways[kind], upstream, "gpt-5.2-codex")]);
}
for (const provider of ["anthropic", "openai-chat", "openai-responses"]) {
  for (const kind of ["chat", "messages", "responses"]) {
    for (const stream of [false, true]) {
      cases.push([`ai-sdk ${provider} ${stream ? "streamText" : "generateText"} via ${kind} upstream`,
        () => aiSdk(gateways[kind], upstream, provider, stream)]);
    }
  }
}

const selected = cases.filter(([name]) => name.includes(filter));
// A few at a time: the CLIs are heavy, the machine is shared.
const results = new Array(selected.length);
let next = 0;
async function worker() {
  while (next < selected.length) {
    const i = next++;
    const [name, fn] = selected[i];
    const started = Date.now();
    let v;
    try {
      v = await fn();
    } catch (e) {
      v = { ok: false, why: String(e?.stack ?? e) };
    }
    results[i] = v;
    console.log(`${v.ok ? "ok  " : "FAIL"} ${name} (${((Date.now() - started) / 1000).toFixed(1)} s)${v.ok ? "" : `: ${v.why}`}`);
    if (!v.ok && v.r) {
      console.log(`---- stdout\n${v.r.out.slice(-3000)}\n---- stderr\n${v.r.err.slice(-3000)}\n----`);
    }
  }
}
await Promise.all([worker(), worker(), worker()]);

// What the upstream was sent, for reading a failure.
fs.writeFileSync(path.join(scratch, "upstream-requests.json"), JSON.stringify(upstream.requests, null, 1));
for (const gw of Object.values(gateways)) gw.child.kill("SIGTERM");
upstream.close();
const failed = results.filter((v) => !v.ok).length;
console.log(`\n${selected.length - failed} passed, ${failed} failed (logs in ${scratch})`);
process.exit(failed ? 1 : 0);
