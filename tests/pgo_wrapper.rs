//! The rustc wrapper that lays release builds out by the committed profile (benches/pgo/rustc): it adds the profile to optimised compiles by the LLVM that wrote it, and leaves every other compile exactly as cargo asked for it.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a wrapper that runs the wrong command should fail the test loudly"
)]

use std::path::{Path, PathBuf};
use std::process::Command;

fn pgo_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("benches/pgo")
}

/// A stand-in for rustc: answers `-vV` with the LLVM version in `FAKE_LLVM`, and otherwise
/// prints the arguments it was given, one per line, so the test sees what the wrapper ran.
fn fake_rustc(dir: &Path) -> PathBuf {
    let path = dir.join("rustc");
    std::fs::write(
        &path,
        "#!/bin/sh\n\
         if [ \"$1\" = -vV ]; then printf 'rustc 0.0.0\\nLLVM version: %s\\n' \"$FAKE_LLVM\"; exit 0; fi\n\
         for a in \"$@\"; do printf '%s\\n' \"$a\"; done\n",
    )
    .unwrap();
    let mut perms = std::fs::metadata(&path).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&path, perms).unwrap();
    path
}

/// The arguments the fake rustc received when the wrapper was run with `args`, under `llvm`.
fn run(args: &[&str], llvm: &str) -> Vec<String> {
    let dir = std::env::temp_dir().join(format!(
        "modelgate-pgo-wrapper-{}-{}",
        std::process::id(),
        fastrand::u64(..)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let rustc = fake_rustc(&dir);
    let out = Command::new(pgo_dir().join("rustc"))
        .arg(&rustc)
        .args(args)
        .env("FAKE_LLVM", llvm)
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).ok();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn profile_llvm() -> String {
    std::fs::read_to_string(pgo_dir().join("llvm-version"))
        .unwrap()
        .trim()
        .to_owned()
}

const RELEASE: &[&str] = &["--crate-name", "x", "src/lib.rs", "-C", "opt-level=3"];

#[test]
fn an_optimised_compile_by_the_profiles_llvm_gets_the_profile() {
    let got = run(RELEASE, &profile_llvm());
    let profile = pgo_dir().join("modelgate.profdata");
    assert!(profile.is_file(), "the profile is committed");
    assert_eq!(
        &got[..RELEASE.len()],
        RELEASE,
        "cargo's arguments come first, unchanged"
    );
    assert_eq!(
        got[RELEASE.len()..],
        [
            format!(
                "-Cprofile-use={}",
                profile.canonicalize().unwrap().display()
            ),
            "-Cllvm-args=-no-pgo-warn-mismatch".to_owned(),
        ]
    );
}

#[test]
fn every_other_compile_is_left_as_cargo_asked() {
    let llvm = profile_llvm();
    // A dev or test build: not optimised.
    let dev = ["--crate-name", "x", "src/lib.rs", "-C", "debuginfo=1"];
    assert_eq!(run(&dev, &llvm), dev);
    // The instrumented build of benches/pgo.sh, and a build that brings its own profile.
    let generate = [RELEASE, &["-Cprofile-generate=/tmp/p"]].concat();
    assert_eq!(run(&generate, &llvm), generate);
    let own = [RELEASE, &["-Cprofile-use=/tmp/other.profdata"]].concat();
    assert_eq!(run(&own, &llvm), own);
    // Another LLVM cannot be trusted to read the profile's format: no profile, a plain build.
    assert_eq!(run(RELEASE, "1.0.0"), RELEASE);
    // Cargo's own queries pass through.
    assert_eq!(run(&["--print", "sysroot"], &llvm), ["--print", "sysroot"]);
}
