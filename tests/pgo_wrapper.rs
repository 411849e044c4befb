//! The rustc wrapper that lays release builds out by the committed profiles (benches/pgo/rustc): it adds the LLVM profile to optimised compiles by the LLVM that wrote it, has BOLT lay out the gateway's binary after it is linked, and leaves every other compile exactly as cargo asked for it.
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

/// A file that runs `text` as a shell script.
fn script(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    let mut perms = std::fs::metadata(path).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(path, perms).unwrap();
}

/// A directory of the test's own, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!(
            "modelgate-pgo-wrapper-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.0).ok();
    }
}

/// A stand-in for rustc: answers `-vV` with the LLVM version in `FAKE_LLVM`, and otherwise
/// prints the arguments it was given, one per line, so the test sees what the wrapper ran; as
/// its link, it writes `linked` to the file `FAKE_LINK` names, if any.
fn fake_rustc(dir: &Path) -> PathBuf {
    let path = dir.join("rustc");
    script(
        &path,
        "#!/bin/sh\n\
         if [ \"$1\" = -vV ]; then printf 'rustc 0.0.0\\nLLVM version: %s\\n' \"$FAKE_LLVM\"; exit 0; fi\n\
         for a in \"$@\"; do printf '%s\\n' \"$a\"; done\n\
         if [ -n \"$FAKE_LINK\" ]; then printf linked > \"$FAKE_LINK\"; fi\n",
    );
    path
}

/// What one run of the wrapper did.
struct Ran {
    /// The arguments the fake rustc received.
    rustc: Vec<String>,
    stderr: String,
}

/// Runs the wrapper with `args` under `llvm`, the fake rustc in `dir`, and `envs` set.
fn wrapper(dir: &Path, args: &[&str], llvm: &str, envs: &[(&str, &std::ffi::OsStr)]) -> Ran {
    let rustc = fake_rustc(dir);
    let out = Command::new(pgo_dir().join("rustc"))
        .arg(&rustc)
        .args(args)
        .env("FAKE_LLVM", llvm)
        .env_remove("MODELGATE_BOLT")
        .envs(envs.iter().copied())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    Ran {
        rustc: String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect(),
        stderr,
    }
}

/// The arguments the fake rustc received when the wrapper was run with `args`, under `llvm`.
fn run(args: &[&str], llvm: &str) -> Vec<String> {
    let dir = Scratch::new();
    wrapper(&dir.0, args, llvm, &[]).rustc
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

/// The gateway's binary as cargo compiles it for a release build, linked into `deps`.
fn gateway_compile(deps: &Path) -> Vec<String> {
    [
        "--crate-name",
        "modelgate",
        "--edition=2021",
        "src/main.rs",
        "--crate-type",
        "bin",
        "--emit=dep-info,link",
        "-C",
        "opt-level=3",
        "-C",
        "extra-filename=-0123abcd",
        "--out-dir",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .chain([deps.display().to_string()])
    .collect()
}

/// A stand-in for llvm-bolt in `dir/bin`: writes its arguments to `dir/bolt-args`, and its
/// output as its input with ` bolted` added; with `FAKE_BOLT_FAIL` set it fails instead.
fn fake_bolt(dir: &Path) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    script(
        &bin.join("llvm-bolt-15"),
        &format!(
            "#!/bin/sh\n\
             printf '%s\\n' \"$@\" > {args}\n\
             if [ -n \"$FAKE_BOLT_FAIL\" ]; then echo 'BOLT-ERROR: no' >&2; exit 1; fi\n\
             in=$1; out=''\n\
             while [ $# -gt 0 ]; do if [ \"$1\" = -o ]; then out=$2; fi; shift; done\n\
             {{ cat \"$in\"; printf ' bolted'; }} > \"$out\"\n",
            args = dir.join("bolt-args").display()
        ),
    );
    bin
}

/// `PATH` with `first` searched before the system's directories.
fn path_with(first: &Path) -> std::ffi::OsString {
    let mut dirs = vec![first.to_path_buf()];
    dirs.extend(std::env::split_paths(&std::env::var_os("PATH").unwrap()));
    std::env::join_paths(dirs).unwrap()
}

#[test]
fn the_gateways_binary_is_linked_with_its_relocations_and_laid_out_by_bolt() {
    let dir = Scratch::new();
    let deps = dir.0.join("deps");
    std::fs::create_dir_all(&deps).unwrap();
    let linked = deps.join("modelgate-0123abcd");
    let path = path_with(&fake_bolt(&dir.0));
    let args = gateway_compile(&deps);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let ran = wrapper(
        &dir.0,
        &args,
        &profile_llvm(),
        &[("PATH", &path), ("FAKE_LINK", linked.as_os_str())],
    );
    assert_eq!(&ran.rustc[..args.len()], args, "cargo's arguments first");
    assert_eq!(
        ran.rustc[args.len()..],
        [
            format!(
                "-Cprofile-use={}",
                pgo_dir()
                    .join("modelgate.profdata")
                    .canonicalize()
                    .unwrap()
                    .display()
            ),
            "-Cllvm-args=-no-pgo-warn-mismatch".to_owned(),
            "-Clink-arg=-Wl,--emit-relocs".to_owned(),
        ],
        "the LLVM profile, and the relocations BOLT needs to move functions"
    );
    let fdata = pgo_dir().join("modelgate.fdata");
    assert!(fdata.is_file(), "BOLT's profile is committed");
    let bolt_args = std::fs::read_to_string(dir.0.join("bolt-args")).unwrap();
    let bolt_args: Vec<&str> = bolt_args.lines().collect();
    assert_eq!(
        bolt_args[0],
        linked.display().to_string(),
        "the linked binary"
    );
    assert!(
        bolt_args.contains(&format!("-data={}", fdata.canonicalize().unwrap().display()).as_str()),
        "{bolt_args:?}"
    );
    for option in [
        "-reorder-blocks=ext-tsp",
        "-reorder-functions=hfsort+",
        "-split-functions",
    ] {
        assert!(bolt_args.contains(&option), "{option} in {bolt_args:?}");
    }
    assert_eq!(
        std::fs::read_to_string(&linked).unwrap(),
        "linked bolted",
        "BOLT's output replaces what was linked"
    );
    assert!(!deps.join("modelgate-0123abcd.bolt").exists());
}

#[test]
fn without_bolt_or_when_it_fails_the_gateway_is_the_llvm_profiles_build() {
    let llvm = profile_llvm();
    // (PATH without BOLT, MODELGATE_BOLT, BOLT failing): what reached rustc, and the binary.
    let cases: [(bool, Option<&str>, bool); 3] = [
        (false, None, false),
        (true, Some("off"), false),
        (true, None, true),
    ];
    for (installed, setting, fails) in cases {
        let dir = Scratch::new();
        let deps = dir.0.join("deps");
        std::fs::create_dir_all(&deps).unwrap();
        let linked = deps.join("modelgate-0123abcd");
        let path = if installed {
            path_with(&fake_bolt(&dir.0))
        } else {
            // Only the tools the wrapper itself runs: no llvm-bolt however the machine is set up.
            let bin = dir.0.join("tools");
            std::fs::create_dir_all(&bin).unwrap();
            for tool in ["sed", "cat", "dirname", "mv", "rm"] {
                let found = std::env::split_paths(&std::env::var_os("PATH").unwrap())
                    .map(|d| d.join(tool))
                    .find(|p| p.is_file())
                    .unwrap();
                std::os::unix::fs::symlink(found, bin.join(tool)).unwrap();
            }
            bin.into_os_string()
        };
        let mut envs = vec![
            ("PATH", path.as_os_str()),
            ("FAKE_LINK", linked.as_os_str()),
        ];
        if let Some(s) = setting {
            envs.push(("MODELGATE_BOLT", s.as_ref()));
        }
        if fails {
            envs.push(("FAKE_BOLT_FAIL", "1".as_ref()));
        }
        let args = gateway_compile(&deps);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let ran = wrapper(&dir.0, &args, &llvm, &envs);
        let case = format!("installed {installed}, MODELGATE_BOLT {setting:?}, fails {fails}");
        assert_eq!(
            std::fs::read_to_string(&linked).unwrap(),
            "linked",
            "{case}: the binary as linked"
        );
        assert!(!deps.join("modelgate-0123abcd.bolt").exists(), "{case}");
        assert_eq!(
            ran.rustc.last().map(String::as_str),
            Some(if fails {
                "-Clink-arg=-Wl,--emit-relocs"
            } else {
                "-Cllvm-args=-no-pgo-warn-mismatch"
            }),
            "{case}: relocations are kept only for BOLT"
        );
        assert_eq!(
            ran.stderr.contains("warning:"),
            fails,
            "{case}: a failed BOLT says so: {}",
            ran.stderr
        );
        assert_eq!(
            dir.0.join("bolt-args").exists(),
            installed && setting.is_none(),
            "{case}"
        );
    }
}

#[test]
fn no_other_compile_goes_through_bolt() {
    let dir = Scratch::new();
    let path = path_with(&fake_bolt(&dir.0));
    let llvm = profile_llvm();
    // Another crate, and the gateway's own library (an rlib).
    let library = [
        "--crate-name",
        "modelgate",
        "src/lib.rs",
        "--crate-type",
        "lib",
        "-C",
        "opt-level=3",
    ];
    // The gateway's binary checked (`cargo check`, clippy): nothing is linked, an earlier
    // build's binary stays as it is.
    let deps = dir.0.join("deps");
    let check: Vec<String> = gateway_compile(&deps)
        .into_iter()
        .map(|a| {
            if a.starts_with("--emit=") {
                "--emit=dep-info,metadata".to_owned()
            } else {
                a
            }
        })
        .collect();
    let check: Vec<&str> = check.iter().map(String::as_str).collect();
    for args in [RELEASE, &library, &check] {
        let ran = wrapper(&dir.0, args, &llvm, &[("PATH", &path)]);
        assert_eq!(&ran.rustc[..args.len()], args);
        assert_eq!(ran.rustc.len(), args.len() + 2, "{:?}", ran.rustc);
    }
    assert!(!dir.0.join("bolt-args").exists(), "BOLT never ran");
}
