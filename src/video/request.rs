//! The video generation request (interface §2.5, §8; gateway.md §7): every rule checked, defaults applied, before anything goes upstream.

use std::borrow::Cow;

use base64::alphabet;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine as _;

use crate::error::GatewayError;
use crate::json::{self, Expected, Raw, RawObject};

/// The two model names of the interface; which upstream serves each is `[[models]]`' business.
pub const MODELS: [&str; 2] = ["video-3.1-generate-001", "video-3.1-fast-generate-001"];
const MIME_TYPES: [&str; 3] = ["image/jpeg", "image/png", "image/webp"];
const RESOLUTIONS: [&str; 2] = ["720p", "1080p"];
const DURATIONS: [i64; 3] = [4, 6, 8];
const ASPECT_RATIOS: [&str; 2] = ["16:9", "9:16"];
const PERSON_GENERATION: [&str; 2] = ["allow_adult", "dont_allow"];

/// Plain base64: the standard alphabet, padding optional (clients differ), nothing else.
const PLAIN_BASE64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// A guiding image: its base64 text (forwarded as sent) and its checked MIME type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    pub base64: String,
    pub mime_type: &'static str,
}

/// A valid request with the interface's defaults filled in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VideoRequest {
    pub prompt: String,
    pub negative_prompt: Option<String>,
    pub image: Option<Image>,
    pub last_frame: Option<Image>,
    pub resolution: &'static str,
    pub duration: u8,
    pub aspect_ratio: &'static str,
    pub generate_audio: bool,
    pub person_generation: &'static str,
}

fn wrong_type(param: &str, expected: Expected, raw: Raw<'_>) -> GatewayError {
    GatewayError::invalid(
        param,
        format!("`{param}` must be {expected}; got {}", json::type_name(raw)),
    )
}

fn quoted(list: &[&str]) -> String {
    list.iter()
        .map(|s| format!("{s:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `model`: required, one of the interface's two names.
pub fn model<'o>(obj: &'o RawObject) -> Result<Cow<'o, str>, GatewayError> {
    let allowed = || format!("one of {}", quoted(&MODELS));
    let raw = obj.get_present("model").ok_or_else(|| {
        GatewayError::invalid("model", format!("`model` is required: {}", allowed()))
    })?;
    let name = json::as_str(raw).map_err(|e| wrong_type("model", e, raw))?;
    if !MODELS.contains(&name.as_ref()) {
        return Err(GatewayError::invalid(
            "model",
            format!("`model` must be {}; got {name:?}", allowed()),
        ));
    }
    Ok(name)
}

/// A nested object field: absent (or null) is `None`, anything but an object is refused.
fn object<'o>(
    obj: &'o RawObject,
    key: &str,
    param: &str,
) -> Result<Option<RawObject<'o>>, GatewayError> {
    obj.get_present(key)
        .map(|raw| json::as_object(raw).map_err(|e| wrong_type(param, e, raw)))
        .transpose()
}

/// A string field, copied: the request body is bounded by `max_request_bytes`.
fn string(obj: &RawObject, key: &str, param: &str) -> Result<Option<String>, GatewayError> {
    obj.get_present(key)
        .map(|raw| {
            json::as_str(raw)
                .map(Cow::into_owned)
                .map_err(|e| wrong_type(param, e, raw))
        })
        .transpose()
}

/// A string field that must be one of `allowed`; absent gives `default`.
fn one_of(
    obj: Option<&RawObject>,
    key: &str,
    param: &str,
    allowed: &[&'static str],
    default: &'static str,
) -> Result<&'static str, GatewayError> {
    let Some(raw) = obj.and_then(|o| o.get_present(key)) else {
        return Ok(default);
    };
    let refuse = |got: String| {
        GatewayError::invalid(
            param,
            format!("`{param}` must be one of {}; got {got}", quoted(allowed)),
        )
    };
    let s = json::as_str(raw).map_err(|_| refuse(raw.get().chars().take(40).collect()))?;
    allowed
        .iter()
        .find(|a| **a == s.as_ref())
        .copied()
        .ok_or_else(|| refuse(format!("{s:?}")))
}

/// Checks a whole create request; `model` was checked (and routed) before.
pub fn validate(obj: &RawObject) -> Result<VideoRequest, GatewayError> {
    let input = object(obj, "input", "input")?.ok_or_else(|| {
        GatewayError::invalid(
            "input.prompt",
            "`input.prompt` is required (the text that guides generation)",
        )
    })?;
    let prompt = string(&input, "prompt", "input.prompt")?.ok_or_else(|| {
        GatewayError::invalid(
            "input.prompt",
            "`input.prompt` is required (the text that guides generation)",
        )
    })?;
    if prompt.trim().is_empty() {
        return Err(GatewayError::invalid(
            "input.prompt",
            "`input.prompt` must not be empty",
        ));
    }
    let negative_prompt = string(&input, "negative_prompt", "input.negative_prompt")?;
    let image = object(&input, "image", "input.image")?
        .map(|o| image_object(&o, "input.image"))
        .transpose()?;
    let last_frame = object(&input, "last_frame", "input.last_frame")?
        .map(|o| image_object(&o, "input.last_frame"))
        .transpose()?;
    if last_frame.is_some() && image.is_none() {
        return Err(GatewayError::invalid(
            "input.last_frame",
            "`input.last_frame` is allowed only together with `input.image` (the first frame)",
        ));
    }
    let params = object(obj, "parameters", "parameters")?;
    let p = params.as_ref();
    let resolution = one_of(
        p,
        "resolution",
        "parameters.resolution",
        &RESOLUTIONS,
        "720p",
    )?;
    let duration = duration(p)?;
    let aspect_ratio = one_of(
        p,
        "aspect_ratio",
        "parameters.aspect_ratio",
        &ASPECT_RATIOS,
        "16:9",
    )?;
    let person_generation = one_of(
        p,
        "person_generation",
        "parameters.person_generation",
        &PERSON_GENERATION,
        "allow_adult",
    )?;
    let generate_audio = match p.and_then(|o| o.get_present("generate_audio")) {
        None => {
            return Err(GatewayError::invalid(
                "parameters.generate_audio",
                "`parameters.generate_audio` is required: true or false",
            ))
        }
        Some(raw) => json::as_bool(raw).map_err(|_| {
            GatewayError::invalid(
                "parameters.generate_audio",
                format!(
                    "`parameters.generate_audio` must be true or false; got {}",
                    json::type_name(raw)
                ),
            )
        })?,
    };
    Ok(VideoRequest {
        prompt,
        negative_prompt,
        image,
        last_frame,
        resolution,
        duration,
        aspect_ratio,
        generate_audio,
        person_generation,
    })
}

fn duration(params: Option<&RawObject>) -> Result<u8, GatewayError> {
    let Some(raw) = params.and_then(|o| o.get_present("duration")) else {
        return Ok(8);
    };
    let param = "parameters.duration";
    let v = json::as_i64(raw).map_err(|_| {
        GatewayError::invalid(
            param,
            format!(
                "`{param}` must be one of 4, 6, 8 (seconds, an integer); got {}",
                raw.get()
            ),
        )
    })?;
    match u8::try_from(v) {
        Ok(d) if DURATIONS.contains(&v) => Ok(d),
        _ => Err(GatewayError::invalid(
            param,
            format!("`{param}` must be one of 4, 6, 8 (seconds); got {v}"),
        )),
    }
}

/// An image object: plain base64 that decodes, a MIME type from the allowed three that the bytes agree with.
fn image_object(obj: &RawObject, path: &str) -> Result<Image, GatewayError> {
    let bytes_param = format!("{path}.bytesBase64Encoded");
    let mime_param = format!("{path}.mimeType");
    let text = string(obj, "bytesBase64Encoded", &bytes_param)?.ok_or_else(|| {
        GatewayError::invalid(
            &bytes_param,
            format!("`{bytes_param}` is required: the image bytes as plain base64"),
        )
    })?;
    let declared = string(obj, "mimeType", &mime_param)?;
    let declared = match declared.as_deref() {
        None => None,
        Some(m) => Some(
            MIME_TYPES
                .iter()
                .find(|a| **a == m)
                .copied()
                .ok_or_else(|| {
                    GatewayError::invalid(
                        &mime_param,
                        format!(
                            "`{mime_param}` must be one of {}; got {m:?}",
                            quoted(&MIME_TYPES)
                        ),
                    )
                })?,
        ),
    };
    let sniffed = check_base64(&text, &bytes_param)?;
    let mime_type = match (declared, sniffed) {
        (Some(d), Some(s)) if d != s => {
            return Err(GatewayError::invalid(
                &mime_param,
                format!("`{mime_param}` is {d:?} but the bytes are {s:?}"),
            ))
        }
        (_, Some(s)) => s,
        (_, None) => {
            return Err(GatewayError::invalid(
                &bytes_param,
                format!("`{bytes_param}` is not a JPEG, PNG or WebP image (its first bytes match none of them)"),
            ))
        }
    };
    Ok(Image {
        base64: text,
        mime_type,
    })
}

/// Checks that `text` is plain base64 of a non-empty image; returns the type its magic bytes show.
///
/// Decodes in 4 KB steps into a small buffer, so a large image is checked without a copy of it.
fn check_base64(text: &str, param: &str) -> Result<Option<&'static str>, GatewayError> {
    let refuse = |why: &str| GatewayError::invalid(param, format!("`{param}` {why}"));
    if text.is_empty() {
        return Err(refuse("must not be empty"));
    }
    if text.len() >= 5 && text[..5].eq_ignore_ascii_case("data:") {
        return Err(refuse(
            "must be plain base64 without a data-URI prefix (remove \"data:…;base64,\")",
        ));
    }
    if let Some(pos) = text.bytes().position(|b| b.is_ascii_whitespace()) {
        return Err(refuse(&format!(
            "must be plain base64 on one line; found whitespace at offset {pos} (use `base64 -w0`)"
        )));
    }
    const STEP: usize = 4096;
    let mut buf = [0u8; STEP / 4 * 3];
    let mut head = [0u8; 12];
    let mut head_len = 0;
    let chunks = text.as_bytes().chunks(STEP);
    let last = chunks.len().saturating_sub(1);
    for (i, chunk) in chunks.enumerate() {
        // Padding is only allowed at the very end; a chunk that ends in it must be the last.
        if i != last && chunk.last() == Some(&b'=') {
            return Err(refuse("is not valid base64 (padding in the middle)"));
        }
        let n = PLAIN_BASE64
            .decode_slice(chunk, &mut buf)
            .map_err(|e| refuse(&format!("is not valid base64: {e}")))?;
        if head_len < head.len() {
            let take = n.min(head.len() - head_len);
            head[head_len..head_len + take].copy_from_slice(&buf[..take]);
            head_len += take;
        }
    }
    if head_len == 0 {
        return Err(refuse("decodes to no bytes"));
    }
    Ok(sniff(&head[..head_len]))
}

/// The image type the first bytes show, if any of the three allowed.
pub fn sniff(head: &[u8]) -> Option<&'static str> {
    if head.starts_with(&[0xff, 0xd8, 0xff]) {
        Some("image/jpeg")
    } else if head.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("image/png")
    } else if head.len() >= 12 && &head[..4] == b"RIFF" && &head[8..12] == b"WEBP" {
        Some("image/webp")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_is_checked_in_steps_with_padding_only_at_the_end() {
        use base64::engine::general_purpose::STANDARD;
        let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
        png.extend(std::iter::repeat_n(7u8, 10_000));
        let text = STANDARD.encode(&png);
        assert_eq!(check_base64(&text, "p").unwrap(), Some("image/png"));
        assert_eq!(
            check_base64(text.trim_end_matches('='), "p").unwrap(),
            Some("image/png")
        );
        // A padded quantum in the middle of a long string: refused even at a step boundary.
        let mut bad = STANDARD.encode([0xffu8, 0xd8, 0xff, 1]);
        bad.truncate(8);
        let glued = format!("{}{}", &bad[..4].repeat(1023), "AA==") + &"A".repeat(8);
        assert!(check_base64(&glued, "p").is_err());
        assert!(check_base64("AAAA!", "p").is_err());
        assert!(check_base64("A", "p").is_err());
    }

    #[test]
    fn magic_numbers() {
        assert_eq!(sniff(&[0xff, 0xd8, 0xff, 0xe0]), Some("image/jpeg"));
        assert_eq!(sniff(b"RIFF\0\0\0\0WEBPVP8 "), Some("image/webp"));
        assert_eq!(sniff(b"RIFF\0\0\0\0WAVE"), None);
        assert_eq!(sniff(b"GIF89a"), None);
    }
}
