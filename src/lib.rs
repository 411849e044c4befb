//! modelgate: a reverse proxy and protocol translator in front of LLM and video providers.
//!
//! A request's way through the code, one module per stage:
//!
//! ```text
//! server      event loops (one per core) accept TCP (TLS by rustls); HTTP/1.1 on our own server
//!             side (`server::h1`), HTTP/2 on hyper's; graceful shutdown
//!  └─ pipeline     auth → read → route → limit → plan → attempts → respond; the one place an
//!       │          error becomes a response, for every address (video included)
//!       ├─ routing      keys, models, targets' state: one ArcSwap, read once per request
//!       │               (`reload` swaps it on SIGHUP or a file change)
//!       ├─ auth         Bearer / x-api-key → Principal, looked up by SHA-256 digest
//!       ├─ route        address + model name → configured Model (exact, then longest prefix*)
//!       ├─ limits       per-key rpm / tpm / concurrency / daily tokens, over `store`
//!       ├─ plan         validate once (`validate`); write the request for each target:
//!       │               `passthrough` edits for the same protocol, `translate` via the IR else
//!       ├─ attempt      which target each try goes to: strategies, health, budget, pauses
//!       ├─ upstream     our HTTP/1.1 client for http:// upstreams, hyper-util's over rustls for https://
//!       │               (HTTP/2 by ALPN); URL join, credential, header hygiene
//!       ├─ body         upstream bodies polled frame by frame: idle timeout, in-stream errors
//!       └─ observe      usage read as it passes; the record, access log and metrics at the end
//! video       the video address: create, look up, download; handed an authenticated call by
//!             the pipeline; task ids are signed (stateless), lookups go through a moka cache
//! ```
//!
//! Leaves everyone reads: `domain` (protocols, addresses, kinds, name patterns), `config` (the
//! TOML file as validated types), `error` over `boxed` (the body type), `gateway` (process-wide
//! services: client, metrics, limiter), `http1` (chunked de-framing and the framing headers'
//! rules, for both HTTP/1.1 sides), `ir` (the canonical representation translation goes
//! through), `sse` (the event-stream codec), `json` (request bodies as raw values so unknown
//! fields survive), `thinking` (one rule for thinking budgets). `mock` is the built-in upstream,
//! a target like any other.

pub mod attempt;
pub mod auth;
pub mod bench;
pub mod body;
pub mod boxed;
pub mod coalesce;
pub mod config;
pub mod count_tokens;
pub mod domain;
pub mod error;
pub mod gateway;
pub mod google_auth;
pub mod http1;
pub mod inplace;
pub mod ir;
pub mod json;
pub mod limits;
pub mod logfmt;
pub mod metrics;
pub mod mock;
pub mod observe;
pub mod passthrough;
pub mod phases;
pub mod pipeline;
pub mod plan;
pub mod reload;
pub mod route;
pub mod routing;
pub mod server;
pub mod sse;
pub mod stateful;
pub mod store;
pub mod thinking;
pub mod tls;
pub mod translate;
pub mod upstream;
pub mod validate;
pub mod video;
