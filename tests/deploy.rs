//! Deployment files under deploy/: every YAML file parses, and the Dockerfile, compose file, nginx config and Kubernetes manifests agree with deploy/modelgate.toml and the binary (ports, probes, drain deadline, config path, secrets); `modelgate check` accepts the config.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a file that does not parse or disagrees with another should fail the test loudly"
)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_yaml_ng::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    let path = root().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every document of a YAML file (`---`-separated), empty documents left out.
fn yaml_docs(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .filter(|v| !v.is_null())
        .collect()
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            yaml_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            out.push(path);
        }
    }
}

fn str_of<'a>(v: &'a Value, what: &str) -> &'a str {
    v.as_str()
        .unwrap_or_else(|| panic!("{what}: expected a string, found {v:?}"))
}

fn seq_of<'a>(v: &'a Value, what: &str) -> &'a [Value] {
    v.as_sequence()
        .unwrap_or_else(|| panic!("{what}: expected a list, found {v:?}"))
}

/// A number or a numeric string (compose writes ports either way).
fn port_of(v: &Value, what: &str) -> u16 {
    match v {
        Value::Number(n) => n.as_u64().and_then(|n| u16::try_from(n).ok()),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
    .unwrap_or_else(|| panic!("{what}: expected a port number, found {v:?}"))
}

/// The drain deadline of `serve` after SIGTERM, read from the binary's source so that a change
/// there shows up here.
fn drain_seconds() -> u64 {
    let main = read("src/main.rs");
    let line = main
        .lines()
        .find(|l| l.contains("const SHUTDOWN_DEADLINE"))
        .expect("src/main.rs defines SHUTDOWN_DEADLINE");
    let secs = line
        .split("from_secs(")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("SHUTDOWN_DEADLINE is not Duration::from_secs(N): {line}"));
    assert!(secs >= 1, "{line}");
    secs
}

/// A compose duration: `45s`, `1m30s`, `2m`, `1h`, `500ms` (or plain seconds).
fn compose_duration_ms(s: &str) -> u64 {
    if let Ok(secs) = s.parse::<u64>() {
        return secs * 1000;
    }
    let mut total = 0;
    let mut digits = String::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        let n: u64 = digits
            .parse()
            .unwrap_or_else(|_| panic!("bad duration {s:?}"));
        digits.clear();
        total += match c {
            'h' => n * 3_600_000,
            'm' if chars.peek() == Some(&'s') => {
                chars.next();
                n
            }
            'm' => n * 60_000,
            's' => n * 1000,
            _ => panic!("bad duration {s:?}"),
        };
    }
    assert!(digits.is_empty(), "bad duration {s:?}");
    total
}

/// What the deploy config says, as far as the deployment files depend on it.
struct Config {
    text: String,
    /// Listener name (`base`, `token_plan`, `video`, `admin`) → port.
    ports: BTreeMap<String, u16>,
    /// Every environment variable the config reads a secret from.
    env: BTreeSet<String>,
    redis_url_env: String,
}

impl Config {
    fn load() -> Config {
        let text = read("deploy/modelgate.toml");
        let doc: toml::Value = toml::from_str(&text).unwrap();
        let mut ports = BTreeMap::new();
        for (name, addr) in doc["listen"].as_table().expect("[listen]") {
            let addr = addr.as_str().unwrap();
            let (host, port) = addr.rsplit_once(':').unwrap();
            assert_eq!(
                host, "0.0.0.0",
                "listen.{name} = {addr:?}: a container must listen on every interface"
            );
            ports.insert(name.clone(), port.parse().unwrap());
        }
        for name in ["base", "token_plan", "video", "admin"] {
            assert!(ports.contains_key(name), "[listen] {name} is missing");
        }

        let mut env = BTreeSet::new();
        let redis_url_env = doc
            .get("store")
            .and_then(|s| s.get("redis_url_env"))
            .and_then(|v| v.as_str())
            .expect("[store] redis_url_env: the replicas share their limits through Redis")
            .to_owned();
        env.insert(redis_url_env.clone());
        let task_secrets = doc
            .get("video")
            .and_then(|v| v.get("task_secrets_env"))
            .and_then(|v| v.as_str())
            .unwrap_or("MODELGATE_TASK_SECRETS");
        env.insert(task_secrets.to_owned());
        let mut key_env = 0;
        for k in doc["keys"].as_array().expect("[[keys]]") {
            if let Some(var) = k.get("key_env").and_then(|v| v.as_str()) {
                env.insert(var.to_owned());
                key_env += 1;
            }
            assert!(
                k.get("key").is_none(),
                "no plaintext key in a deployment config: {k}"
            );
        }
        assert!(key_env >= 1, "at least one key read through key_env");
        assert!(
            doc["keys"].as_array().unwrap().iter().any(|k| {
                ["rpm", "tpm", "max_concurrent", "daily_tokens"]
                    .iter()
                    .all(|l| k.get(*l).is_some())
            }),
            "one key shows every per-key limit"
        );
        for u in doc["upstreams"].as_array().expect("[[upstreams]]") {
            if let Some(var) = u.get("api_key_env").and_then(|v| v.as_str()) {
                env.insert(var.to_owned());
            }
        }
        Config {
            text,
            ports,
            env,
            redis_url_env,
        }
    }

    fn port(&self, name: &str) -> u16 {
        self.ports[name]
    }

    fn all_ports(&self) -> BTreeSet<u16> {
        self.ports.values().copied().collect()
    }

    /// The ports clients use (every listener but admin).
    fn client_ports(&self) -> BTreeSet<u16> {
        self.ports
            .iter()
            .filter(|(n, _)| *n != "admin")
            .map(|(_, p)| *p)
            .collect()
    }
}

/// Where the images and manifests say the config file is.
const CONFIG_PATH: &str = "/etc/modelgate/modelgate.toml";

/// `redis://host:port[/db]` → (host, port).
fn redis_host_port(url: &str) -> (String, u16) {
    let rest = url
        .strip_prefix("redis://")
        .or_else(|| url.strip_prefix("rediss://"))
        .unwrap_or_else(|| panic!("not a redis URL: {url}"));
    let authority = rest.split('/').next().unwrap();
    let hostport = authority.rsplit('@').next().unwrap();
    let (host, port) = hostport.rsplit_once(':').unwrap_or((hostport, "6379"));
    (host.to_owned(), port.parse().unwrap())
}

/// The `--config FILE` of a `serve` command line.
fn config_arg(args: &[Value], what: &str) -> String {
    let args: Vec<&str> = args.iter().map(|a| str_of(a, what)).collect();
    assert_eq!(args.first(), Some(&"serve"), "{what}: {args:?}");
    let i = args
        .iter()
        .position(|a| *a == "--config")
        .unwrap_or_else(|| panic!("{what}: no --config in {args:?}"));
    args.get(i + 1)
        .unwrap_or_else(|| panic!("{what}: --config without a file"))
        .to_string()
}

#[test]
fn every_yaml_file_under_deploy_parses() {
    let mut files = Vec::new();
    yaml_files(&root().join("deploy"), &mut files);
    let names: BTreeSet<String> = files
        .iter()
        .map(|p| {
            p.strip_prefix(root().join("deploy"))
                .unwrap()
                .display()
                .to_string()
        })
        .collect();
    for expected in [
        "compose.yaml",
        "kubernetes/configmap.yaml",
        "kubernetes/deployment.yaml",
        "kubernetes/service.yaml",
        "kubernetes/redis.yaml",
        "kubernetes/secret.example.yaml",
        "kubernetes/kustomization.yaml",
    ] {
        assert!(names.contains(expected), "deploy/{expected} is missing");
    }
    for f in &files {
        let docs = yaml_docs(f);
        assert!(!docs.is_empty(), "{}: no document", f.display());
        if f.parent().unwrap().ends_with("kubernetes") {
            for d in &docs {
                assert!(
                    d["apiVersion"].is_string() && d["kind"].is_string(),
                    "{}: a document without apiVersion/kind",
                    f.display()
                );
            }
        }
    }
}

/// Dockerfile instructions with their `\` continuations joined.
fn dockerfile_instructions() -> Vec<String> {
    let text = read("deploy/Dockerfile");
    let mut out = Vec::new();
    let mut cur = String::new();
    for line in text.lines() {
        let t = line.trim();
        if cur.is_empty() && (t.is_empty() || t.starts_with('#')) {
            continue;
        }
        if let Some(head) = t.strip_suffix('\\') {
            cur.push_str(head);
            cur.push(' ');
        } else {
            cur.push_str(t);
            out.push(std::mem::take(&mut cur));
        }
    }
    assert!(cur.is_empty(), "Dockerfile ends inside a continued line");
    out
}

#[test]
fn dockerfile_agrees_with_the_config() {
    let cfg = Config::load();
    let ins = dockerfile_instructions();
    let with = |kw: &str| -> Vec<&str> {
        ins.iter()
            .filter_map(|i| {
                let (k, rest) = i.split_once(char::is_whitespace)?;
                k.eq_ignore_ascii_case(kw).then_some(rest.trim())
            })
            .collect()
    };

    assert!(with("FROM").len() >= 2, "a multi-stage build");
    assert!(
        with("RUN")
            .iter()
            .any(|r| r.contains("cargo build --release --locked")),
        "the builder runs cargo build --release --locked"
    );

    let exposed: BTreeSet<u16> = with("EXPOSE")
        .iter()
        .flat_map(|e| e.split_whitespace())
        .map(|p| p.trim_end_matches("/tcp").parse().unwrap())
        .collect();
    assert_eq!(exposed, cfg.all_ports(), "EXPOSE vs [listen]");

    let health = with("HEALTHCHECK");
    assert_eq!(health.len(), 1, "one HEALTHCHECK");
    let readyz = format!("127.0.0.1:{}/readyz", cfg.port("admin"));
    assert!(
        health[0].contains(&readyz),
        "HEALTHCHECK must poll {readyz}: {}",
        health[0]
    );
    let tool = health[0]
        .split_whitespace()
        .skip_while(|w| *w != "CMD")
        .nth(1)
        .expect("HEALTHCHECK ... CMD tool");
    assert!(
        with("RUN")
            .iter()
            .any(|r| r.contains("apt-get install") && r.contains(tool)),
        "the runtime image installs {tool}, which HEALTHCHECK runs"
    );

    assert_eq!(with("STOPSIGNAL"), ["SIGTERM"]);
    let user = with("USER");
    assert!(!user.is_empty(), "a USER");
    let last_user = user.last().unwrap().split(':').next().unwrap();
    assert!(
        last_user != "root" && last_user != "0",
        "the runtime runs as a non-root user, not {last_user}"
    );
    assert!(
        last_user.parse::<u32>().is_ok(),
        "USER is numeric so that Kubernetes' runAsNonRoot can check it: {last_user}"
    );

    assert!(
        with("COPY")
            .iter()
            .any(|c| *c == format!("deploy/modelgate.toml {CONFIG_PATH}")),
        "the image carries deploy/modelgate.toml at {CONFIG_PATH}"
    );
    assert!(
        with("COPY")
            .iter()
            .any(|c| c.starts_with("--from=") && c.ends_with(" /usr/local/bin/modelgate")),
        "the binary at /usr/local/bin/modelgate"
    );
    assert!(
        with("ENV")
            .iter()
            .any(|e| e.contains(&format!("MODELGATE_CONFIG={CONFIG_PATH}"))),
        "ENV MODELGATE_CONFIG={CONFIG_PATH}"
    );
    let cmd = with("CMD");
    let cmd: Vec<Value> = serde_json::from_str::<Vec<String>>(cmd.last().expect("a CMD"))
        .expect("CMD in exec form")
        .into_iter()
        .map(Value::String)
        .collect();
    assert_eq!(config_arg(&cmd, "Dockerfile CMD"), CONFIG_PATH);

    let ignore = read(".dockerignore");
    for dir in ["target", ".venv", ".git"] {
        assert!(
            ignore
                .lines()
                .any(|l| l.trim().trim_end_matches('/') == dir),
            ".dockerignore leaves out {dir}/"
        );
    }
}

#[test]
fn compose_agrees_with_the_config_and_the_dockerfile() {
    let cfg = Config::load();
    let drain_ms = drain_seconds() * 1000;
    let docs = yaml_docs(&root().join("deploy/compose.yaml"));
    assert_eq!(docs.len(), 1);
    let services = docs[0]["services"].as_mapping().expect("services");
    let service = |name: &str| -> &Value {
        services
            .get(name)
            .unwrap_or_else(|| panic!("compose: no service {name}"))
    };

    // The gateways: every service running `modelgate serve`.
    let gateways: Vec<(&str, &Value)> = services
        .iter()
        .filter(|(_, s)| {
            s["command"]
                .as_sequence()
                .is_some_and(|c| c.first().and_then(Value::as_str) == Some("serve"))
        })
        .map(|(n, s)| (n.as_str().unwrap(), s))
        .collect();
    assert_eq!(gateways.len(), 2, "two gateway instances");
    let built: Vec<&&Value> = gateways
        .iter()
        .map(|(_, s)| s)
        .filter(|s| !s["build"].is_null())
        .collect();
    assert!(!built.is_empty(), "a gateway built from the Dockerfile");
    for b in built {
        assert_eq!(b["build"]["context"].as_str(), Some(".."));
        let dockerfile = str_of(&b["build"]["dockerfile"], "build.dockerfile");
        assert!(
            root().join(dockerfile).is_file(),
            "build.dockerfile {dockerfile} (relative to the context, the repository root)"
        );
    }
    let image = gateways[0].1["image"].as_str();
    assert!(
        gateways.iter().all(|(_, s)| s["image"].as_str() == image),
        "both gateways run one image"
    );

    let redis_url_env = &cfg.redis_url_env;
    let mut redis_service = None;
    for (name, g) in &gateways {
        let what = format!("compose {name}");
        let command = seq_of(&g["command"], &what);
        assert_eq!(config_arg(command, &what), CONFIG_PATH, "{what}");

        let env = g["environment"]
            .as_mapping()
            .unwrap_or_else(|| panic!("{what}: environment as a mapping"));
        let names: BTreeSet<&str> = env.keys().map(|k| k.as_str().unwrap()).collect();
        for var in &cfg.env {
            assert!(
                names.contains(var.as_str()),
                "{what}: the config reads {var}, the environment does not set it"
            );
        }
        assert_eq!(
            env.get("MODELGATE_CONFIG").and_then(Value::as_str),
            Some(CONFIG_PATH),
            "{what}"
        );
        let url = str_of(&env[redis_url_env.as_str()], redis_url_env);
        redis_service = Some(redis_host_port(url));

        let volumes = seq_of(&g["volumes"], &what);
        let mount = volumes
            .iter()
            .map(|v| str_of(v, "volume"))
            .find(|v| v.split(':').nth(1) == Some(CONFIG_PATH))
            .unwrap_or_else(|| panic!("{what}: nothing mounted at {CONFIG_PATH}"));
        let parts: Vec<&str> = mount.split(':').collect();
        assert_eq!(
            root().join("deploy").join(parts[0]).canonicalize().unwrap(),
            root().join("deploy/modelgate.toml").canonicalize().unwrap(),
            "{what}: the mounted config is deploy/modelgate.toml"
        );
        assert_eq!(parts.get(2), Some(&"ro"), "{what}: mounted read-only");

        let exposed: BTreeSet<u16> = seq_of(&g["expose"], &what)
            .iter()
            .map(|p| port_of(p, &what))
            .collect();
        assert_eq!(exposed, cfg.all_ports(), "{what}: expose vs [listen]");

        let test: Vec<&str> = seq_of(&g["healthcheck"]["test"], &what)
            .iter()
            .map(|t| str_of(t, "healthcheck"))
            .collect();
        let readyz = format!("127.0.0.1:{}/readyz", cfg.port("admin"));
        assert!(
            test.iter().any(|t| t.contains(&readyz)),
            "{what}: healthcheck polls {readyz}: {test:?}"
        );

        let grace = compose_duration_ms(str_of(&g["stop_grace_period"], "stop_grace_period"));
        assert!(
            grace > drain_ms,
            "{what}: stop_grace_period {grace} ms must exceed the {drain_ms} ms drain"
        );
        if let Some(sig) = g["stop_signal"].as_str() {
            assert_eq!(sig, "SIGTERM", "{what}");
        }
    }

    // Redis: the service the URL names, healthy before the gateways start.
    let (redis_host, redis_port) = redis_service.unwrap();
    let redis = service(&redis_host);
    assert!(
        str_of(&redis["image"], "redis image").starts_with("redis:"),
        "{redis_host} runs Redis"
    );
    assert_eq!(redis_port, 6379);
    assert!(
        !redis["healthcheck"]["test"].is_null(),
        "Redis has a healthcheck"
    );
    for (name, g) in &gateways {
        assert_eq!(
            g["depends_on"][redis_host.as_str()]["condition"].as_str(),
            Some("service_healthy"),
            "{name} waits for a healthy Redis"
        );
    }

    // The load balancer: nginx on the client ports, in front of both gateways once healthy.
    let (lb_name, lb) = services
        .iter()
        .find(|(_, s)| s["image"].as_str().is_some_and(|i| i.starts_with("nginx")))
        .expect("an nginx load balancer");
    let lb_name = lb_name.as_str().unwrap();
    for (name, _) in &gateways {
        assert_eq!(
            lb["depends_on"][*name]["condition"].as_str(),
            Some("service_healthy"),
            "{lb_name} waits for a healthy {name}"
        );
    }
    let published: BTreeSet<u16> = seq_of(&lb["ports"], lb_name)
        .iter()
        .map(|p| {
            let p = str_of(p, "port");
            let (host, container) = p.rsplit_once(':').unwrap();
            assert_eq!(host, container, "{lb_name} publishes {p} on the same port");
            container.parse().unwrap()
        })
        .collect();
    assert_eq!(
        published,
        cfg.client_ports(),
        "{lb_name} publishes the client ports"
    );
    let conf_mount = seq_of(&lb["volumes"], lb_name)
        .iter()
        .map(|v| str_of(v, "volume"))
        .find(|v| v.contains(":/etc/nginx/nginx.conf"))
        .expect("nginx.conf mounted");
    let conf_file = conf_mount.split(':').next().unwrap();
    let nginx = std::fs::read_to_string(root().join("deploy").join(conf_file)).unwrap();
    check_nginx(&nginx, &cfg, &gateways);
}

/// nginx listens on every client port and sends each to the same port of every gateway, with
/// HTTP/1.1 upstream and no buffering (streams).
fn check_nginx(conf: &str, cfg: &Config, gateways: &[(&str, &Value)]) {
    let statements: Vec<String> = conf
        .lines()
        .map(|l| l.split('#').next().unwrap().trim().to_owned())
        .filter(|l| !l.is_empty())
        .collect();
    let has = |s: &str| statements.iter().any(|l| l.trim_end_matches(';') == s);
    assert!(has("proxy_buffering off"), "nginx: proxy_buffering off");
    assert!(
        has("proxy_http_version 1.1"),
        "nginx: proxy_http_version 1.1"
    );
    assert!(
        has("proxy_set_header Connection \"\""),
        "nginx: keep-alive to the gateways"
    );

    let listens: BTreeSet<u16> = statements
        .iter()
        .filter_map(|l| l.strip_prefix("listen "))
        .map(|p| p.trim_end_matches(';').trim().parse().unwrap())
        .collect();
    assert_eq!(
        listens,
        cfg.client_ports(),
        "nginx listens on the client ports"
    );

    let servers: BTreeSet<(String, u16)> = statements
        .iter()
        .filter_map(|l| l.strip_prefix("server "))
        .filter(|s| !s.starts_with('{'))
        .map(|s| {
            let target = s.split_whitespace().next().unwrap().trim_end_matches(';');
            let (host, port) = target.rsplit_once(':').unwrap();
            (host.to_owned(), port.parse().unwrap())
        })
        .collect();
    let expected: BTreeSet<(String, u16)> = gateways
        .iter()
        .flat_map(|(name, _)| {
            cfg.client_ports()
                .into_iter()
                .map(move |p| (name.to_string(), p))
        })
        .collect();
    assert_eq!(
        servers, expected,
        "nginx upstreams: every gateway on every client port"
    );
}

/// The Kubernetes manifests, by kind and name.
struct Kube {
    docs: BTreeMap<(String, String), Value>,
}

impl Kube {
    fn load() -> Kube {
        let dir = root().join("deploy/kubernetes");
        let kustomization = yaml_docs(&dir.join("kustomization.yaml"));
        let listed: BTreeSet<String> = seq_of(&kustomization[0]["resources"], "resources")
            .iter()
            .map(|r| str_of(r, "resource").to_owned())
            .collect();
        let mut files = Vec::new();
        yaml_files(&dir, &mut files);
        let present: BTreeSet<String> = files
            .iter()
            .map(|f| f.file_name().unwrap().to_str().unwrap().to_owned())
            .filter(|f| f != "kustomization.yaml")
            .collect();
        assert_eq!(
            listed, present,
            "kustomization.yaml lists every manifest (and only those)"
        );

        let mut docs = BTreeMap::new();
        for f in &listed {
            for d in yaml_docs(&dir.join(f)) {
                let key = (
                    str_of(&d["kind"], "kind").to_owned(),
                    str_of(&d["metadata"]["name"], "metadata.name").to_owned(),
                );
                assert!(
                    docs.insert(key.clone(), d).is_none(),
                    "{key:?} defined twice"
                );
            }
        }
        Kube { docs }
    }

    fn get(&self, kind: &str, name: &str) -> &Value {
        self.docs
            .get(&(kind.to_owned(), name.to_owned()))
            .unwrap_or_else(|| panic!("no {kind} {name} in deploy/kubernetes"))
    }

    fn only(&self, kind: &str) -> Vec<&Value> {
        self.docs
            .iter()
            .filter(|((k, _), _)| k == kind)
            .map(|(_, v)| v)
            .collect()
    }
}

/// A probe's or Service's port: a number, or the name of a containerPort.
fn resolve_port(port: &Value, container_ports: &BTreeMap<String, u16>, what: &str) -> u16 {
    match port {
        Value::String(name) if name.parse::<u16>().is_err() => *container_ports
            .get(name)
            .unwrap_or_else(|| panic!("{what}: no containerPort named {name}")),
        other => port_of(other, what),
    }
}

#[test]
fn kubernetes_manifests_agree_with_the_config() {
    let cfg = Config::load();
    let drain = drain_seconds();
    let kube = Kube::load();

    let deployment = kube.get("Deployment", "modelgate");
    let spec = &deployment["spec"];
    assert_eq!(spec["replicas"].as_u64(), Some(2), "two replicas");
    let pod = &spec["template"]["spec"];
    let pod_labels = spec["template"]["metadata"]["labels"].as_mapping().unwrap();
    for (k, v) in spec["selector"]["matchLabels"].as_mapping().unwrap() {
        assert_eq!(pod_labels.get(k), Some(v), "the selector matches the pods");
    }
    let containers = seq_of(&pod["containers"], "containers");
    assert_eq!(containers.len(), 1);
    let c = &containers[0];

    // Ports.
    let container_ports: BTreeMap<String, u16> = seq_of(&c["ports"], "ports")
        .iter()
        .map(|p| {
            (
                str_of(&p["name"], "port name").to_owned(),
                port_of(&p["containerPort"], "containerPort"),
            )
        })
        .collect();
    assert_eq!(
        container_ports.values().copied().collect::<BTreeSet<_>>(),
        cfg.all_ports(),
        "containerPorts vs [listen]"
    );
    for (listener, port) in &cfg.ports {
        let name = listener.replace('_', "-");
        assert_eq!(
            container_ports.get(&name),
            Some(port),
            "containerPort {name} is [listen] {listener}"
        );
    }

    // Probes on the admin port.
    let admin = cfg.port("admin");
    for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
        let get = &c[probe]["httpGet"];
        assert_eq!(get["path"].as_str(), Some(path), "{probe} path");
        assert_eq!(
            resolve_port(&get["port"], &container_ports, probe),
            admin,
            "{probe} on the admin port"
        );
    }

    // Shutdown: the preStop pause and the drain fit in the grace period.
    let pre_stop: u64 = match &c["lifecycle"]["preStop"] {
        v if !v["sleep"].is_null() => v["sleep"]["seconds"].as_u64().unwrap(),
        v => {
            let cmd: Vec<&str> = seq_of(&v["exec"]["command"], "preStop")
                .iter()
                .map(|a| str_of(a, "preStop"))
                .collect();
            assert_eq!(cmd.first(), Some(&"sleep"), "preStop sleeps: {cmd:?}");
            cmd[1].parse().unwrap()
        }
    };
    assert!(
        (1..=15).contains(&pre_stop),
        "a preStop pause of a few seconds"
    );
    let grace = pod["terminationGracePeriodSeconds"]
        .as_u64()
        .expect("terminationGracePeriodSeconds");
    assert!(
        grace > drain + pre_stop,
        "terminationGracePeriodSeconds {grace} must exceed the preStop {pre_stop} s + the {drain} s drain"
    );

    // The config: the ConfigMap's key, mounted as a directory, is the file serve reads.
    let args = seq_of(&c["args"], "args");
    let config_file = config_arg(args, "Deployment args");
    let env: Vec<&Value> = c["env"]
        .as_sequence()
        .map(|e| e.iter().collect())
        .unwrap_or_default();
    let env_value = |name: &str| {
        env.iter()
            .find(|e| e["name"].as_str() == Some(name))
            .and_then(|e| e["value"].as_str())
    };
    assert_eq!(
        env_value("MODELGATE_CONFIG"),
        Some(config_file.as_str()),
        "MODELGATE_CONFIG and --config agree"
    );
    let (dir, file) = config_file.rsplit_once('/').unwrap();
    let mounts = seq_of(&c["volumeMounts"], "volumeMounts");
    let mount = mounts
        .iter()
        .find(|m| m["mountPath"].as_str() == Some(dir))
        .unwrap_or_else(|| panic!("nothing mounted at {dir}"));
    assert!(
        mount["subPath"].is_null() && mount["subPathExpr"].is_null(),
        "the config is mounted as a directory: a subPath mount never sees ConfigMap updates"
    );
    assert_eq!(mount["readOnly"].as_bool(), Some(true));
    let volume_name = str_of(&mount["name"], "volumeMount name");
    let volume = seq_of(&pod["volumes"], "volumes")
        .iter()
        .find(|v| v["name"].as_str() == Some(volume_name))
        .unwrap_or_else(|| panic!("no volume {volume_name}"));
    let cm_name = str_of(&volume["configMap"]["name"], "volume configMap.name");
    assert!(
        volume["configMap"]["items"].is_null(),
        "the whole ConfigMap is mounted"
    );
    let cm = kube.get("ConfigMap", cm_name);
    let data = cm["data"].as_mapping().expect("ConfigMap data");
    assert_eq!(
        data.keys().map(|k| k.as_str().unwrap()).collect::<Vec<_>>(),
        [file],
        "the ConfigMap's one key is the file serve reads"
    );
    assert!(
        data[file].as_str() == Some(cfg.text.as_str()),
        "kubernetes/configmap.yaml must carry deploy/modelgate.toml word for word"
    );

    // Secrets: every variable the config reads comes from the Secret (or a literal env entry).
    let secrets = kube.only("Secret");
    let secret_keys = |name: &str| -> BTreeSet<String> {
        let s = secrets
            .iter()
            .find(|s| s["metadata"]["name"].as_str() == Some(name))
            .unwrap_or_else(|| panic!("no Secret {name}"));
        ["stringData", "data"]
            .iter()
            .filter_map(|d| s[*d].as_mapping())
            .flat_map(|m| m.keys().map(|k| k.as_str().unwrap().to_owned()))
            .collect()
    };
    let mut provided = BTreeSet::new();
    for from in c["envFrom"].as_sequence().into_iter().flatten() {
        if let Some(name) = from["secretRef"]["name"].as_str() {
            let prefix = from["prefix"].as_str().unwrap_or("");
            provided.extend(
                secret_keys(name)
                    .into_iter()
                    .map(|k| format!("{prefix}{k}")),
            );
        }
    }
    for e in &env {
        let name = str_of(&e["name"], "env name");
        let by_ref = &e["valueFrom"]["secretKeyRef"];
        if let Some(secret) = by_ref["name"].as_str() {
            let key = str_of(&by_ref["key"], "secretKeyRef.key");
            assert!(
                secret_keys(secret).contains(key),
                "env {name}: Secret {secret} has no {key}"
            );
            provided.insert(name.to_owned());
        }
    }
    for var in &cfg.env {
        assert!(
            provided.contains(var),
            "the config reads {var}; the Deployment does not get it from a Secret"
        );
        assert!(
            env_value(var).is_none(),
            "{var} is a secret: from the Secret, not a literal in the Deployment"
        );
    }

    // Redis: the URL in the Secret names the Service of redis.yaml.
    let secret_values: BTreeMap<String, String> = secrets
        .iter()
        .filter_map(|s| s["stringData"].as_mapping())
        .flat_map(|m| {
            m.iter().map(|(k, v)| {
                (
                    k.as_str().unwrap().to_owned(),
                    v.as_str().unwrap().to_owned(),
                )
            })
        })
        .collect();
    let (host, port) = redis_host_port(&secret_values[&cfg.redis_url_env]);
    let redis_svc = kube.get("Service", &host);
    assert!(
        seq_of(&redis_svc["spec"]["ports"], "redis ports")
            .iter()
            .any(|p| port_of(&p["port"], "port") == port),
        "Service {host} serves port {port}"
    );
    let redis = kube.get("Deployment", &host);
    assert_eq!(redis["spec"]["replicas"].as_u64(), Some(1));
    assert!(
        str_of(
            &redis["spec"]["template"]["spec"]["containers"][0]["image"],
            "redis image"
        )
        .starts_with("redis:"),
        "Deployment {host} runs Redis"
    );

    // Security.
    assert_eq!(
        pod["securityContext"]["runAsNonRoot"].as_bool(),
        Some(true),
        "runAsNonRoot"
    );
    assert_eq!(
        c["securityContext"]["readOnlyRootFilesystem"].as_bool(),
        Some(true),
        "readOnlyRootFilesystem"
    );
    assert!(
        !c["resources"]["requests"].is_null() && !c["resources"]["limits"].is_null(),
        "resources"
    );

    // The Service: the client ports, pointing at the container's ports; admin not exposed.
    let svc = kube.get("Service", "modelgate");
    for (k, v) in svc["spec"]["selector"].as_mapping().expect("selector") {
        assert_eq!(pod_labels.get(k), Some(v), "the Service selects the pods");
    }
    let mut service_ports = BTreeSet::new();
    for p in seq_of(&svc["spec"]["ports"], "Service ports") {
        let port = port_of(&p["port"], "Service port");
        let target = if p["targetPort"].is_null() {
            port
        } else {
            resolve_port(&p["targetPort"], &container_ports, "targetPort")
        };
        assert_eq!(
            port, target,
            "Service port {port} → container port {target}"
        );
        service_ports.insert(target);
    }
    assert_eq!(
        service_ports,
        cfg.client_ports(),
        "the Service exposes base, token_plan and video (not admin)"
    );
}

#[test]
fn modelgate_check_accepts_the_deploy_config_with_the_example_secrets() {
    let cfg = Config::load();
    let kube = Kube::load();
    // Only the example Secret's values: the check must not pass thanks to this machine's env.
    let mut env = BTreeMap::new();
    for s in kube.only("Secret") {
        for (k, v) in s["stringData"].as_mapping().into_iter().flatten() {
            env.insert(
                k.as_str().unwrap().to_owned(),
                v.as_str().unwrap().to_owned(),
            );
        }
    }
    for var in &cfg.env {
        assert!(env.contains_key(var), "secret.example.yaml defines {var}");
    }
    let check = |path: &Path| {
        std::process::Command::new(env!("CARGO_BIN_EXE_modelgate"))
            .arg("check")
            .arg("--config")
            .arg(path)
            .env_clear()
            .envs(&env)
            .output()
            .unwrap()
    };

    let out = check(&root().join("deploy/modelgate.toml"));
    assert!(
        out.status.success(),
        "modelgate check failed on deploy/modelgate.toml:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(table.starts_with("MODEL"), "{table}");
    assert!(table.contains("demo-chat"), "{table}");
}
