//! Task and file id tests: signing, verification, rotation, and mangled ids refused.

use super::*;

fn signer(secrets: &[&str]) -> Signer {
    let s: Vec<Vec<u8>> = secrets.iter().map(|s| s.as_bytes().to_vec()).collect();
    Signer::new(&s, &[0; 32])
}

fn task() -> TaskToken {
    TaskToken {
        created_ms: 1_767_225_600_123,
        upstream: "veo".into(),
        model: "veo-3.1-generate-001".into(),
        client_model: Some("video-3.1-generate-001".into()),
        reference:
            "projects/p/locations/l/publishers/google/models/veo-3.1-generate-001/operations/1234"
                .into(),
    }
}

const PREFIX: &str =
    "projects/p/locations/l/publishers/google/models/veo-3.1-generate-001/operations/";

fn prefix(_: &str, _: &str) -> Option<String> {
    Some(PREFIX.to_owned())
}

#[test]
fn task_ids_round_trip_and_are_url_safe_and_short() {
    let s = signer(&["one"]);
    let id = s.sign_task("alice", &task(), Some(PREFIX));
    assert!(
        id.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
        "{id}"
    );
    assert!(
        id.len() < 80,
        "the prefix keeps the id short: {} chars",
        id.len()
    );
    assert_eq!(s.verify_task("alice", &id, prefix), Some(task()));
    // Without the prefix the reference is spelled out, and still verifies.
    let long = s.sign_task("alice", &task(), None);
    assert!(long.len() > id.len());
    assert_eq!(s.verify_task("alice", &long, |_, _| None), Some(task()));
}

#[test]
fn another_key_or_secret_or_any_change_is_refused() {
    let s = signer(&["one"]);
    let id = s.sign_task("alice", &task(), Some(PREFIX));
    assert_eq!(
        s.verify_task("bob", &id, prefix),
        None,
        "bound to the creator's key"
    );
    assert_eq!(signer(&["two"]).verify_task("alice", &id, prefix), None);
    for cut in 1..id.len() {
        assert_eq!(
            s.verify_task("alice", &id[..cut], prefix),
            None,
            "truncated at {cut}"
        );
    }
    let bytes = id.as_bytes();
    for i in 0..bytes.len() {
        let mut altered = bytes.to_vec();
        altered[i] = if altered[i] == b'A' { b'B' } else { b'A' };
        let altered = String::from_utf8(altered).unwrap();
        assert_eq!(
            s.verify_task("alice", &altered, prefix),
            None,
            "altered at {i}"
        );
    }
    assert_eq!(s.verify_task("alice", "", prefix), None);
    assert_eq!(s.verify_task("alice", "not base64!", prefix), None);
    assert_eq!(s.verify_task("alice", &"A".repeat(5000), prefix), None);
}

#[test]
fn rotation_the_first_signs_all_verify() {
    let old = signer(&["old"]);
    let id = old.sign_task("alice", &task(), None);
    let rotated = signer(&["new", "old"]);
    assert_eq!(rotated.verify_task("alice", &id, |_, _| None), Some(task()));
    let fresh = rotated.sign_task("alice", &task(), None);
    assert_eq!(
        signer(&["new"]).verify_task("alice", &fresh, |_, _| None),
        Some(task())
    );
    assert_eq!(old.verify_task("alice", &fresh, |_, _| None), None);
}

#[test]
fn unset_secret_is_the_process_secret() {
    let a = Signer::new(&[], &[1; 32]);
    let b = Signer::new(&[], &[2; 32]);
    // A reload builds a new signer from the same process secret: its ids still verify.
    let reloaded = Signer::new(&[], &[1; 32]);
    let id = a.sign_task("alice", &task(), None);
    assert!(a.verify_task("alice", &id, |_, _| None).is_some());
    assert!(b.verify_task("alice", &id, |_, _| None).is_none());
    assert!(reloaded.verify_task("alice", &id, |_, _| None).is_some());
}

#[test]
fn file_ids_round_trip_and_are_not_task_ids() {
    let s = signer(&["one"]);
    let sources = [
        FileSource::Mock,
        FileSource::Gcs {
            upstream: "veo".into(),
            bucket: "b".into(),
            object: "out/1/sample_0.mp4".into(),
        },
        FileSource::Remote {
            upstream: "gem".into(),
            uri: "https://x/v1beta/files/abc:download?alt=media".into(),
        },
        FileSource::Inline {
            upstream: "veo".into(),
            model: "veo-3.1-generate-001".into(),
            reference: format!("{PREFIX}99"),
            mime: "video/mp4".into(),
        },
    ];
    for source in sources {
        let f = FileToken {
            expires_s: 1_800_000_000,
            key: "alice".into(),
            model: "video-3.1-generate-001".into(),
            source,
        };
        let id = s.sign_file(&f, Some(PREFIX));
        assert_eq!(s.verify_file(&id, prefix), Some(f.clone()));
        assert_eq!(s.verify_task("", &id, prefix), None);
        assert_eq!(signer(&["two"]).verify_file(&id, prefix), None);
    }
    let task_id = s.sign_task("", &task(), None);
    assert_eq!(s.verify_file(&task_id, prefix), None);
}

#[test]
fn varints_cover_the_whole_range() {
    for v in [0, 1, 127, 128, 300, u64::from(u32::MAX), u64::MAX] {
        let mut w = Writer::default();
        w.uint(v);
        let mut r = Reader::new(&w.0);
        assert_eq!(r.uint(), Some(v));
        assert_eq!(r.end(), Some(()));
    }
    // Eleven continuation bytes overflow a u64: refused, not wrapped.
    let mut r = Reader::new(&[0xff; 11]);
    assert_eq!(r.uint(), None);
}

#[test]
fn client_model_names_cost_a_byte_unless_they_differ() {
    let s = signer(&["one"]);
    for client in ["video-3.1-generate-001", "veo-3.1-generate-001", "my-video"] {
        let mut t = task();
        t.client_model = Some(client.into());
        let id = s.sign_task("alice", &t, Some(PREFIX));
        assert_eq!(s.verify_task("alice", &id, prefix), Some(t));
    }
}

#[test]
fn version_1_ids_still_verify() {
    let s = signer(&["one"]);
    let mut w = Writer::default();
    w.byte(VERSION_1);
    w.uint(5);
    w.str("veo");
    w.str("m");
    w.reference("op/1", None);
    let id = s.seal(TASK_DOMAIN, b"alice", w.0);
    let t = s.verify_task("alice", &id, |_, _| None).unwrap();
    assert_eq!((t.client_model, t.reference.as_str()), (None, "op/1"));
    let mut w = Writer::default();
    w.byte(VERSION_1);
    w.uint(7);
    w.byte(0);
    let id = s.seal(FILE_DOMAIN, b"", w.0);
    let f = s.verify_file(&id, |_, _| None).unwrap();
    assert_eq!((f.key.as_str(), f.source), ("", FileSource::Mock));
}
