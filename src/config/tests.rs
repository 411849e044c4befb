//! Config parsing tests: defaults, every error with its key path, secrets kept out of messages.

use super::*;

fn parse(text: &str) -> Result<Config, ConfigErrors> {
    Config::parse(text, Path::new("."), &|name| match name {
        "SET" => Some("value".to_owned()),
        "SECRETS" => Some("new, old".to_owned()),
        _ => None,
    })
}

fn errors(text: &str) -> Vec<String> {
    match parse(text) {
        Ok(_) => panic!("expected errors"),
        Err(e) => e.0,
    }
}

fn has(errs: &[String], needle: &str) {
    assert!(
        errs.iter().any(|e| e.contains(needle)),
        "no error containing {needle:?} in {errs:#?}"
    );
}

const MINIMAL: &str = r#"
[listen]
base = "127.0.0.1:8080"

[[upstreams]]
name = "mock"
kind = "mock"

[[models]]
name = "m"
upstream = "mock"
"#;

#[test]
fn minimal_config_gets_defaults() {
    let c = parse(MINIMAL).unwrap();
    assert_eq!(c.limits.max_request_bytes, 32 * 1024 * 1024);
    assert_eq!(c.limits.connect_timeout, Duration::from_millis(5000));
    assert_eq!(c.limits.idle_timeout, Duration::from_millis(300_000));
    assert_eq!(c.models[0].endpoints, EndpointSet::ALL);
    assert_eq!(c.models[0].addresses, AddressSet::only(Address::Base));
    assert_eq!(c.models[0].thinking, ThinkingStyle::None);
    assert_eq!(c.video.file_url_ttl, Duration::from_secs(86_400));
    assert!(c.video.task_secrets.is_empty());
}

#[test]
fn every_error_is_reported_together_with_its_path() {
    let errs = errors(
        r#"
nonsense = 1
[listen]
base = "localhost"
admin = "127.0.0.1:9090"
video = "127.0.0.1:9090"

[limits]
connect_timeout_ms = 0
extra = true

[[keys]]
name = "k"
key_env = "UNSET"
addresses = ["moon"]

[[keys]]
name = "k"
key = "a"
sha256 = "00"

[[upstreams]]
name = "u"
kind = "chat"

[[upstreams]]
name = "u"
kind = "telepathy"

[[upstreams]]
name = "v"
kind = "chat"
base_url = "http://x/v1"
api_key_env = "UNSET"

[[models]]
name = "m"
upstream = "opneai"
thinking = "sometimes"
hosted_tools = "maybe"
endpoints = ["chat", "fax"]

[[models]]
name = "a*b"
upstream = "v"
"#,
    );
    has(&errs, "nonsense: unknown key");
    has(&errs, "listen.base: invalid address \"localhost\"");
    has(
        &errs,
        "listen.admin: address 127.0.0.1:9090 is already used by listen.video",
    );
    has(&errs, "limits: unknown field `extra`");
    has(
        &errs,
        "keys[0].key_env: environment variable UNSET is not set",
    );
    has(&errs, "keys[0].addresses[0]: unknown address \"moon\"");
    has(&errs, "keys[1]: exactly one of");
    has(&errs, "upstreams[0].base_url: required for kind \"chat\"");
    has(&errs, "upstreams[1].name: duplicate upstream name \"u\"");
    has(&errs, "upstreams[1].kind: unknown kind \"telepathy\"");
    has(
        &errs,
        "upstreams[2].api_key_env: environment variable UNSET is not set",
    );
    has(&errs, "models[0].upstream: no upstream named \"opneai\"");
    has(&errs, "models[0].thinking: unknown value \"sometimes\"");
    has(
        &errs,
        "models[0].hosted_tools: unknown value \"maybe\"; allowed: drop, refuse",
    );
    has(&errs, "models[0].endpoints[1]: unknown endpoint \"fax\"");
    has(&errs, "models[1].name: invalid pattern \"a*b\"");
}

#[test]
fn secrets_never_appear_in_errors() {
    let errs = errors(
        r#"
[listen]
base = "127.0.0.1:1"
[[keys]]
name = "k"
sha256 = "not-hex-but-a-secret-looking-thing"
[[upstreams]]
name = "u"
kind = "chat"
base_url = "http://x/v1"
api_key_env = "SET"
[[models]]
name = "m"
upstream = "nope"
"#,
    );
    has(&errs, "keys[0].sha256: must be 64 hex characters");
    assert!(errs.iter().all(|e| !e.contains("value")), "{errs:?}");
}

#[test]
fn same_model_name_allowed_on_disjoint_addresses_only() {
    let base = r#"
[listen]
base = "127.0.0.1:1"
token_plan = "127.0.0.1:2"
[[upstreams]]
name = "a"
kind = "mock"
[[upstreams]]
name = "b"
kind = "mock"
"#;
    let ok = format!(
        "{base}\n[[models]]\nname = \"m\"\nupstream = \"a\"\n[[models]]\nname = \"m\"\nupstream = \"b\"\naddresses = [\"token_plan\"]\n"
    );
    assert!(parse(&ok).is_ok());
    let clash = format!(
        "{base}\n[[models]]\nname = \"m\"\nupstream = \"a\"\n[[models]]\nname = \"m\"\nupstream = \"b\"\naddresses = [\"base\", \"token_plan\"]\n"
    );
    has(
        &errors(&clash),
        "models[1].name: duplicate model name \"m\" on address(es) base",
    );
}

#[test]
fn model_addresses_need_a_listener_and_fit_the_upstream_kind() {
    let errs = errors(
        r#"
[listen]
base = "127.0.0.1:1"
[[upstreams]]
name = "u"
kind = "chat"
base_url = "http://x/v1"
[[upstreams]]
name = "veo"
kind = "veo-gemini"
base_url = "https://generativelanguage.googleapis.com/v1beta"
api_key_env = "SET"
[[models]]
name = "m"
upstream = "u"
addresses = ["token_plan"]
[[models]]
name = "v"
upstream = "veo"
addresses = ["base"]
"#,
    );
    has(
        &errs,
        "models[0].addresses[0]: address \"token_plan\" has no listener",
    );
    has(
        &errs,
        "models[1].addresses: upstream \"veo\" is a video upstream",
    );
}

#[test]
fn base_url_query_survives_the_join_and_credentials_are_formatted_per_kind() {
    let c = parse(
        r#"
[listen]
base = "127.0.0.1:1"
[[upstreams]]
name = "c"
kind = "chat"
base_url = "https://h.example/v1/?api-version=2"
api_key_env = "SET"
[[upstreams]]
name = "a"
kind = "messages"
base_url = "https://api.anthropic.com/v1"
api_key_env = "SET"
[[models]]
name = "m"
upstream = "c"
"#,
    )
    .unwrap();
    let chat = &c.upstreams[0];
    assert_eq!(
        chat.uri_for(Protocol::Chat).unwrap().to_string(),
        "https://h.example/v1/chat/completions?api-version=2"
    );
    assert_eq!(
        chat.credential.as_ref().unwrap().header_value(),
        "Bearer value"
    );
    assert!(chat
        .credential
        .as_ref()
        .unwrap()
        .header_value()
        .is_sensitive());
    assert_eq!(format!("{:?}", chat.credential), "Some(Secret(***))");
    let msgs = &c.upstreams[1];
    assert_eq!(msgs.credential.as_ref().unwrap().header_value(), "value");
}

#[test]
fn task_secrets_come_from_the_named_variable() {
    let c = parse(&format!(
        "{MINIMAL}\n[video]\ntask_secrets_env = \"SECRETS\"\n"
    ))
    .unwrap();
    assert_eq!(c.video.task_secrets, vec![b"new".to_vec(), b"old".to_vec()]);
}

#[test]
fn tls_files_that_do_not_exist_are_an_error() {
    let errs = errors(&format!(
        "{MINIMAL}\n[tls]\ncert = \"/nonexistent/c.pem\"\nkey = \"/nonexistent/k.pem\"\n"
    ));
    has(
        &errs,
        "tls: cannot read certificate file /nonexistent/c.pem",
    );
}

#[test]
fn syntax_errors_are_reported() {
    has(&errors("[listen\nbase="), "syntax:");
    has(&errors(""), "listen: missing");
}

const TWO_UPSTREAMS: &str = r#"
[listen]
base = "127.0.0.1:8080"

[[upstreams]]
name = "a"
kind = "chat"
base_url = "http://127.0.0.1:1/v1"

[[upstreams]]
name = "b"
kind = "messages"
base_url = "http://127.0.0.1:2/v1"
"#;

#[test]
fn targets_strategy_retry_and_health_with_model_overrides() {
    let c = parse(&format!(
        r#"{TWO_UPSTREAMS}
[retry]
attempts = 4
on = ["connect", "5xx"]
backoff_ms = 50

[health]
eject_after = 3

[[models]]
name = "m"
strategy = "latency"
thinking = "chat_template_kwargs"
targets = [
  {{ upstream = "a", upstream_model = "a-1", weight = 3 }},
  {{ upstream = "b", thinking = "anthropic", default_max_tokens = 2000 }},
]
fallbacks = ["f"]
retry = {{ attempts = 2 }}
health = {{ eject_ms = 500 }}

[[models]]
name = "f"
upstream = "b"
"#
    ))
    .unwrap();
    let m = &c.models[0];
    assert_eq!(m.strategy, Strategy::Latency);
    assert_eq!(m.targets.len(), 2);
    assert_eq!(
        (m.targets[0].upstream.name.as_ref(), m.targets[0].weight),
        ("a", 3)
    );
    assert_eq!(m.targets[0].upstream_model.as_deref(), Some("a-1"));
    assert_eq!(m.targets[0].thinking, ThinkingStyle::ChatTemplateKwargs);
    assert_eq!(m.targets[1].thinking, ThinkingStyle::Anthropic);
    assert_eq!(m.targets[1].default_max_tokens, Some(2000));
    assert_eq!(m.fallbacks, ["f"]);
    // The model's own keys win; the rest come from [retry] and [health], then the defaults.
    assert_eq!(m.retry.attempts, 2);
    assert_eq!(m.retry.backoff, Duration::from_millis(50));
    assert!(m.retry.on.connect && m.retry.on.server_error);
    assert!(!m.retry.on.rate_limited && !m.retry.on.timeout);
    assert_eq!(m.retry.budget_percent, 20);
    assert_eq!(m.health.eject_after, 3);
    assert_eq!(m.health.eject, Duration::from_millis(500));
    let f = &c.models[1];
    assert_eq!((f.retry.attempts, f.health.eject_after), (4, 3));
    assert_eq!(f.health.eject, Duration::from_millis(10_000));
    let table = c.routing_table();
    assert!(
        table.contains("a-1") && table.contains("latency"),
        "{table}"
    );
    assert!(table.contains("fallbacks m: f"), "{table}");
}

#[test]
fn target_errors_name_their_key_path() {
    let errs = errors(&format!(
        r#"{TWO_UPSTREAMS}
[retry]
attempts = 0
on = ["connect", "4xx"]
budget_percent = 101

[[models]]
name = "both"
upstream = "a"
targets = [{{ upstream = "b" }}]

[[models]]
name = "neither"

[[models]]
name = "bad"
strategy = "fastest"
targets = [{{ upstream = "nope" }}, {{ upstream = "a", weight = 0, thinking = "loud" }}]
fallbacks = ["bad", "ghost"]
"#
    ));
    has(&errs, "retry.attempts: must be between 1 and 10");
    has(&errs, "retry.on[1]: unknown value \"4xx\"");
    has(&errs, "retry.budget_percent: must be between 0 and 100");
    has(&errs, "models[0]: give either `upstream`");
    has(&errs, "models[1].upstream: missing");
    has(&errs, "models[2].strategy: unknown strategy \"fastest\"");
    has(
        &errs,
        "models[2].targets[0].upstream: no upstream named \"nope\"",
    );
    has(&errs, "models[2].targets[1].weight: must be at least 1");
    has(
        &errs,
        "models[2].targets[1].thinking: unknown value \"loud\"",
    );
    has(
        &errs,
        "models[2].fallbacks[0]: a model cannot fall back to itself",
    );
    has(
        &errs,
        "models[2].fallbacks[1]: no LLM model named \"ghost\"",
    );
}

#[test]
fn a_mock_upstream_speaks_the_protocol_it_is_given() {
    let c = parse(
        r#"
[listen]
base = "127.0.0.1:8080"

[[upstreams]]
name = "mock"
kind = "mock"

[[upstreams]]
name = "mock-anthropic"
kind = "mock"
protocol = "messages"

[[models]]
name = "m"
upstream = "mock-anthropic"
"#,
    )
    .unwrap();
    assert_eq!(c.upstreams[0].protocol(), Some(Protocol::Chat));
    assert_eq!(c.upstreams[1].protocol(), Some(Protocol::Messages));
    let errs = errors(
        r#"
[listen]
base = "127.0.0.1:8080"

[[upstreams]]
name = "mock"
kind = "mock"
protocol = "grpc"

[[upstreams]]
name = "a"
kind = "chat"
base_url = "http://127.0.0.1:1/v1"
protocol = "chat"
"#,
    );
    has(&errs, "upstreams[0].protocol: unknown protocol \"grpc\"");
    has(
        &errs,
        "upstreams[1].protocol: only a mock upstream takes `protocol`",
    );
}

#[test]
fn max_connections_is_bounded_by_what_a_semaphore_holds() {
    let too_many = format!("{MINIMAL}\n[limits]\nmax_connections = {}\n", u64::MAX / 2);
    has(
        &errors(&too_many),
        "limits.max_connections: must be at most",
    );
    let fine = format!("{MINIMAL}\n[limits]\nmax_connections = 100000\n");
    assert!(parse(&fine).is_ok());
}

#[test]
fn server_workers_default_to_the_cores_and_are_range_checked() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert_eq!(parse(MINIMAL).unwrap().server.workers, cores);
    let with = |section: &str| format!("{MINIMAL}\n[server]\n{section}\n");
    assert_eq!(parse(&with("workers = 0")).unwrap().server.workers, 0);
    assert_eq!(parse(&with("workers = 3")).unwrap().server.workers, 3);
    for bad in ["workers = -1", "workers = 1025"] {
        let errs = errors(&with(bad));
        has(&errs, "server.workers");
        has(&errs, "allowed: 0 (the starting runtime) to 1024");
    }
    has(&errors(&with("threads = 2")), "server");
    has(&errors(&with("workers = \"auto\"")), "server");
    let next = parse(&with("workers = 5")).unwrap();
    assert!(parse(MINIMAL)
        .unwrap()
        .restart_needed(&next)
        .contains(&"server"));
}
