#!/usr/bin/env bash
# The agents suite as CI runs it: installs the pinned clients from npm (package-lock.json), then
# drives them through target/debug/modelgate (run.mjs). Skips, saying so, only when npm or its
# registry cannot be reached; anything else that fails, fails the step.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

if ! command -v npm >/dev/null 2>&1 || ! command -v node >/dev/null 2>&1; then
    echo "SKIPPED: the agents suite needs node and npm, and this machine has none" >&2
    exit 0
fi
if ! timeout 60 npm ping >/dev/null 2>&1; then
    echo "SKIPPED: the npm registry is unreachable, so the agent clients cannot be installed" >&2
    exit 0
fi
node --version
# Incremental, so a CI machine that ran this before reuses its 400 MB of clients.
npm install --no-audit --no-fund --loglevel=error
export MODELGATE_BIN="${MODELGATE_BIN:-$PWD/../../target/debug/modelgate}"
node run.mjs "$@"
