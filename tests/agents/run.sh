#!/usr/bin/env bash
# The agents suite as CI runs it: installs the pinned clients from npm (package-lock.json), then
# drives them through target/debug/modelgate (run.mjs). Skips, saying so, only when node is
# missing, or when the clients are not installed and the registry cannot be reached; anything
# else that fails, fails the step.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

if ! command -v npm >/dev/null 2>&1 || ! command -v node >/dev/null 2>&1; then
    echo "SKIPPED: the agents suite needs node and npm, and this machine has none" >&2
    exit 0
fi
major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$major" -lt 20 ]; then
    echo "FAILED: the agent clients need Node 20 or later; this machine has $(node --version)" >&2
    exit 1
fi
node --version
# The registry is needed only to install: clients already installed (or in npm's cache) from the
# lock file run without it. Incremental, so a CI machine that ran this before reuses its 400 MB.
if timeout 60 npm ping >/dev/null 2>&1; then
    npm install --no-audit --no-fund --loglevel=error
elif npm install --offline --no-audit --no-fund --loglevel=error; then
    echo "the npm registry is unreachable; using the clients installed from package-lock.json"
else
    echo "SKIPPED: the npm registry is unreachable and the agent clients are not installed" >&2
    exit 0
fi
export MODELGATE_BIN="${MODELGATE_BIN:-$PWD/../../target/debug/modelgate}"
node run.mjs "$@"
