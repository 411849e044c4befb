//! modelgate: a reverse proxy and protocol translator in front of LLM and video providers.
//!
//! A request's way through the code, one module per stage:
//!
//! ```text
//! server      accept TCP (TLS by rustls), HTTP/1.1 + HTTP/2, graceful shutdown
//!  └─ pipeline     the stages below in order; the one place an error becomes a response
//!       ├─ auth         Bearer / x-api-key → Principal, looked up by SHA-256 digest
//!       ├─ route        address + model name → configured Model (exact, then longest prefix*)
//!       ├─ validate     the interface's rules, before anything goes upstream
//!       ├─ passthrough  same protocol: targeted edits (model, thinking switch), bytes otherwise kept
//!       ├─ upstream     pooled hyper-util client over rustls; URL join, credential, header hygiene
//!       ├─ translate    other protocol: client wire → IR → upstream wire, and back (replies, streams)
//!       └─ body         the response body polled frame by frame: idle timeout, in-stream errors
//! video       sibling of translate on the video address: create, look up, download; task ids
//!             are signed (stateless), lookups go through a moka cache
//! ```
//!
//! `config` turns the TOML file into the validated types every stage reads; `mock` is the
//! built-in upstream; `json` keeps request bodies as raw values so unknown fields survive; `ir`
//! is the canonical representation translation goes through; `sse` the event-stream codec.

pub mod attempt;
pub mod auth;
pub mod bench;
pub mod body;
pub mod boxed;
pub mod config;
pub mod domain;
pub mod error;
pub mod gateway;
pub mod ir;
pub mod json;
pub mod limits;
pub mod metrics;
pub mod mock;
pub mod observe;
pub mod passthrough;
pub mod pipeline;
pub mod plan;
pub mod reload;
pub mod route;
pub mod routing;
pub mod server;
pub mod sse;
pub mod store;
pub mod thinking;
pub mod tls;
pub mod translate;
pub mod upstream;
pub mod validate;
pub mod video;
