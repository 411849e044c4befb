//! Inline-video scanner tests: base64 found and decoded across any split, escapes and elision.

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use http_body_util::{BodyExt, StreamBody};

use super::*;

fn video(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 % 251) as u8).collect()
}

fn operation(b64: &str) -> String {
    format!(
        r#"{{"name":"op/1","note":"a \"bytesBase64Encoded\" string is no key","done":true,
 "response":{{"@type":"x","videos":[{{"bytesBase64Encoded" : "{b64}","mimeType":"video/mp4"}}],"raiMediaFilteredCount":0}}}}"#
    )
}

/// Feeds `text` to a fresh scanner split at `cuts`; returns (json kept, video text).
fn scan(text: &[u8], cuts: &[usize], first_only: bool) -> (Vec<u8>, Vec<u8>) {
    let mut s = Scanner::new(first_only);
    let (mut json, mut vid) = (Vec::new(), Vec::new());
    let mut start = 0;
    for &cut in cuts.iter().chain(std::iter::once(&text.len())) {
        s.feed(&text[start..cut], |part, bytes| match part {
            Part::Json => json.extend_from_slice(bytes),
            Part::Video => vid.extend_from_slice(bytes),
        });
        start = cut;
    }
    (json, vid)
}

#[test]
fn any_split_gives_the_same_parts() {
    let b64 = STANDARD.encode(video(300));
    let op = operation(&b64);
    let whole = scan(op.as_bytes(), &[], false);
    assert_eq!(whole.1, b64.as_bytes());
    let expected_json = operation("");
    assert_eq!(String::from_utf8(whole.0.clone()).unwrap(), expected_json);
    let mut rng = fastrand::Rng::with_seed(3);
    for _ in 0..300 {
        let mut cuts: Vec<usize> = (0..rng.usize(0..12))
            .map(|_| rng.usize(0..=op.len()))
            .collect();
        cuts.sort_unstable();
        assert_eq!(scan(op.as_bytes(), &cuts, false), whole, "cuts {cuts:?}");
    }
    // Byte by byte.
    let cuts: Vec<usize> = (1..op.len()).collect();
    assert_eq!(scan(op.as_bytes(), &cuts, false), whole);
}

#[test]
fn escapes_and_gemini_key_and_first_only() {
    let text = br#"{"video":{"encodedVideo":"QU\/C","encoding":"video/mp4"},"more":{"encodedVideo":"WFla"}}"#;
    let (json, vid) = scan(text, &[], true);
    assert_eq!(vid, b"QU/C");
    assert_eq!(json, br#"{"video":{"encodedVideo":"""#);
    let (json, vid) = scan(text, &[], false);
    assert_eq!(vid, b"QU/CWFla");
    assert_eq!(
        json,
        br#"{"video":{"encodedVideo":"","encoding":"video/mp4"},"more":{"encodedVideo":""}}"#
    );
    // A key whose value is not a string, and a long string, are not video.
    let (_, vid) = scan(
        br#"{"encodedVideo":null,"x":"encodedVideoencodedVideo","y":"z"}"#,
        &[],
        false,
    );
    assert!(vid.is_empty());
}

#[test]
fn base64_stream_decodes_any_split_and_url_safe() {
    let data = video(1000);
    for text in [STANDARD.encode(&data), URL_SAFE_NO_PAD.encode(&data)] {
        let mut rng = fastrand::Rng::with_seed(9);
        for _ in 0..50 {
            let mut d = Base64Stream::default();
            let mut out = Vec::new();
            let mut rest = text.as_bytes();
            while !rest.is_empty() {
                let n = rng.usize(1..=rest.len().min(17));
                out.extend(d.push(&rest[..n]).unwrap());
                rest = &rest[n..];
            }
            out.extend(d.finish().unwrap());
            assert_eq!(out, data);
        }
    }
    let mut d = Base64Stream::default();
    assert!(d.push(b"AA!A").is_err());
}

fn body_of(chunks: Vec<Vec<u8>>) -> impl HttpBody<Data = Bytes, Error = BoxError> + Unpin {
    let frames = chunks
        .into_iter()
        .map(|c| Ok::<_, BoxError>(Frame::data(Bytes::from(c))));
    StreamBody::new(futures_util::stream::iter(frames))
}

fn split(text: &[u8], size: usize) -> Vec<Vec<u8>> {
    text.chunks(size).map(<[u8]>::to_vec).collect()
}

#[tokio::test]
async fn decode_body_streams_the_first_video() {
    let data = video(100_000);
    let op = operation(&STANDARD.encode(&data));
    for size in [1, 7, 4096, op.len()] {
        let body = DecodeBody::new(body_of(split(op.as_bytes(), size)));
        let got = body.collect().await.unwrap().to_bytes();
        assert_eq!(got.len(), data.len(), "chunk size {size}");
        assert!(got == data, "chunk size {size}");
    }
}

#[tokio::test]
async fn decode_body_fails_without_a_video_or_when_cut() {
    let no_video = DecodeBody::new(body_of(vec![br#"{"done":true}"#.to_vec()]));
    assert!(no_video.collect().await.is_err());
    let op = operation(&STANDARD.encode(video(100)));
    let cut = DecodeBody::new(body_of(vec![op.as_bytes()[..op.len() / 2].to_vec()]));
    assert!(cut.collect().await.is_err());
}

#[tokio::test]
async fn read_elided_keeps_the_json_small() {
    let op = operation(&STANDARD.encode(video(200_000)));
    let (json, found) = read_elided(body_of(split(op.as_bytes(), 1000)), 4096)
        .await
        .unwrap();
    assert!(found);
    let v: serde_json::Value = serde_json::from_slice(&json).unwrap();
    assert_eq!(v["response"]["videos"][0]["bytesBase64Encoded"], "");
    assert_eq!(v["response"]["videos"][0]["mimeType"], "video/mp4");
    let (_, found) = read_elided(body_of(vec![b"{}".to_vec()]), 10)
        .await
        .unwrap();
    assert!(!found);
    assert!(read_elided(body_of(vec![vec![b' '; 100]]), 10)
        .await
        .is_err());
}
