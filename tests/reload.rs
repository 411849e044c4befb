//! Config reload: SIGHUP and file changes on the real binary, an invalid file refused, and streams that started before a reload finishing on the old config.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::disallowed_methods,
    reason = "test code: a failed setup step should fail the test loudly, and test tasks end with the test"
)]

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::*;
use modelgate::config::Config;
use modelgate::reload::{self, Outcome};
use serde_json::json;

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("modelgate-reload-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Writes `text` to `path` the way editors and ConfigMap updates do: a new file renamed over it.
fn replace_file(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn gateway_config(extra_key: &str, model: &str) -> String {
    format!(
        r#"
[listen]
base = "127.0.0.1:0"
admin = "127.0.0.1:0"

[[keys]]
name = "first"
key = "sk-first"

{extra_key}

[[upstreams]]
name = "mock"
kind = "mock"

[[models]]
name = "{model}"
upstream = "mock"
"#
    )
}

/// The binary serving `config`, and the base and admin addresses it printed.
struct Served {
    child: Child,
    base: String,
    admin: String,
}

impl Served {
    fn start(config: &Path) -> Self {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_modelgate"))
            .arg("serve")
            .arg("--config")
            .arg(config)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let (mut base, mut admin) = (None, None);
        while base.is_none() || admin.is_none() {
            let line = rx
                .recv_timeout(Duration::from_secs(20))
                .expect("the gateway prints its listeners");
            let Some(url) = line
                .split("listening on ")
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next())
            else {
                continue;
            };
            if line.contains("listener=\"base\"") || line.contains("listener=base") {
                base = Some(url.trim().to_owned());
            } else if line.contains("admin") {
                admin = Some(url.trim().to_owned());
            }
        }
        Self {
            child,
            base: base.unwrap(),
            admin: admin.unwrap(),
        }
    }

    fn signal(&self, name: &str) {
        let ok = std::process::Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{name}");
    }

    async fn status(&self, key: &str, model: &str) -> u16 {
        client()
            .post(format!("{}/v1/chat/completions", self.base))
            .bearer_auth(key)
            .json(&chat_body(model))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    }

    async fn reloads(&self, result: &str) -> u64 {
        let text = client()
            .get(format!("{}/metrics", self.admin))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let needle = format!("modelgate_config_reloads_total{{result=\"{result}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&needle))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no {needle} in {text}"))
    }

    /// Polls until `reloads(result)` reaches `n`: the reload runs on its own task.
    async fn wait_reloads(&self, result: &str, n: u64) {
        let deadline = Instant::now() + Duration::from_secs(15);
        while self.reloads(result).await < n {
            assert!(Instant::now() < deadline, "no {result} reload #{n}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Points the link `path` at `target` by renaming a new link over it, as Kubernetes does when it
/// updates a mounted ConfigMap.
fn relink(path: &Path, target: &Path) {
    let tmp = path.with_extension("link-tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A SIGHUP sent the moment the listeners are announced reloads: the handler is in place before
/// the announcement, so the signal's default action (ending the process) never applies.
#[tokio::test]
async fn a_sighup_right_after_start_reloads_and_the_gateway_keeps_serving() {
    let dir = temp_dir("early");
    let path = dir.join("modelgate.toml");
    std::fs::write(&path, gateway_config("", "m1")).unwrap();
    for _ in 0..3 {
        let served = Served::start(&path);
        served.signal("HUP");
        served.wait_reloads("ok", 1).await;
        assert_eq!(served.status("sk-first", "m1").await, 200);
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn sighup_and_file_changes_reload_and_an_invalid_file_changes_nothing() {
    // The config is a link into another directory, like a mounted ConfigMap: an edit of the
    // file it points to raises no event where the gateway watches, so only SIGHUP sees it.
    let dir = temp_dir("signal");
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let path = dir.join("modelgate.toml");
    let a = data.join("a.toml");
    std::fs::write(&a, gateway_config("", "m1")).unwrap();
    relink(&path, &a);
    let served = Served::start(&path);
    assert_eq!(served.status("sk-first", "m1").await, 200);
    assert_eq!(served.status("sk-second", "m1").await, 401);

    let second_key = "[[keys]]\nname = \"second\"\nkey = \"sk-second\"\n";
    std::fs::write(&a, gateway_config(second_key, "m2")).unwrap();
    served.signal("HUP");
    served.wait_reloads("ok", 1).await;
    assert_eq!(served.status("sk-second", "m2").await, 200);
    assert_eq!(served.status("sk-first", "m1").await, 404, "m1 is gone");

    // An invalid file swapped in: refused, and the running config keeps serving.
    let b = data.join("b.toml");
    std::fs::write(
        &b,
        gateway_config(second_key, "m3").replace("kind = \"mock\"", "kind = \"mockk\""),
    )
    .unwrap();
    relink(&path, &b);
    served.wait_reloads("error", 1).await;
    assert_eq!(served.status("sk-second", "m2").await, 200);

    // A valid file swapped in: picked up by the watcher with no signal.
    let c = data.join("c.toml");
    std::fs::write(&c, gateway_config("", "m4")).unwrap();
    relink(&path, &c);
    let deadline = Instant::now() + Duration::from_secs(15);
    while served.status("sk-first", "m4").await != 200 {
        assert!(
            Instant::now() < deadline,
            "the file change was not picked up"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(served.status("sk-second", "m2").await, 401);

    // An editor's save: a new file renamed over the old (here over the link itself).
    replace_file(&path, &gateway_config("", "m5"));
    let deadline = Instant::now() + Duration::from_secs(15);
    while served.status("sk-first", "m5").await != 200 {
        assert!(Instant::now() < deadline, "the rename was not picked up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn a_stream_started_before_a_reload_finishes_on_the_old_config() {
    let chunk = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}]}\n\n";
    let up = FakeUpstream::start(move |_| {
        Reply::sse(vec![
            (Duration::ZERO, chunk),
            (Duration::from_millis(300), chunk),
            (Duration::from_millis(300), "data: [DONE]\n\n"),
        ])
    })
    .await;
    let first = chat_config(&up.url());
    let gw = TestGateway::start(&first).await;
    let mut body = chat_body("m");
    body["stream"] = json!(true);
    let resp = client()
        .post(gw.base("/v1/chat/completions"))
        .bearer_auth(KEY)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);

    // The model the stream uses is removed, and its upstream renamed.
    let path = Path::new("next.toml");
    let next = first
        .replace("name = \"m\"\n", "name = \"renamed\"\n")
        .replace("name = \"up\"", "name = \"up2\"")
        .replace("upstream = \"up\"", "upstream = \"up2\"");
    let parse = |text: &str| Config::parse(text, Path::new("."), &|_| Some("up-secret".into()));
    let mut current = parse(&first).unwrap();
    let outcome = reload::apply(gw.running.gateway(), path, &mut current, parse(&next));
    assert!(
        matches!(&outcome, Outcome::Applied { restart_needed } if restart_needed.is_empty()),
        "{outcome:?}"
    );

    let text = resp.text().await.unwrap();
    assert_eq!(text, format!("{chunk}{chunk}data: [DONE]\n\n"));
    let (status, _, _) = post_json(&gw.base("/v1/chat/completions"), chat_body("m")).await;
    assert_eq!(status, 404, "new requests see the new config");
    let (status, headers, _) =
        post_json(&gw.base("/v1/chat/completions"), chat_body("renamed")).await;
    assert_eq!(status, 200);
    assert_eq!(headers["x-modelgate-upstream"], "up2");

    // The limits differ: applied, with the sections that need a restart named.
    let limited = next.replace("max_request_bytes = 65536", "max_request_bytes = 1000");
    let outcome = reload::apply(gw.running.gateway(), path, &mut current, parse(&limited));
    assert!(
        matches!(&outcome, Outcome::Applied { restart_needed } if restart_needed == &["limits"]),
        "{outcome:?}"
    );
}
