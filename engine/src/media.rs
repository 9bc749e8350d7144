//! What a part that is not plain text costs (docs/wire-format.md#parts): an image by its
//! pixel size read from its header, a PDF by its pages, audio by its seconds, reasoning by
//! its text, each by the model's rules ([`MediaRules`]). A base64 payload is never handed
//! to the tokenizer and never decoded past what its header needs (a PDF's page count is
//! the exception: it reads the document).

use base64::Engine;
use plugin_api::parts::{opaque_type, PartKind};
use plugin_api::Tokenizer;

pub use history_config::{ImageRule, MediaRules};

/// OpenAI's audio input: a token per 100 ms.
const AUDIO_TOKENS_PER_SECOND: u64 = 10;
/// Audio whose length its header does not give (not WAV): a minute's worth.
const AUDIO_UNKNOWN_TOKENS: u64 = 60 * AUDIO_TOKENS_PER_SECOND;
/// The most of an image's bytes read to find its size (a JPEG's size follows its EXIF).
const MAX_HEADER_BYTES: usize = 512 * 1024;

/// The tokens of an opaque part by its kind, or `None` for a part counted as its JSON
/// text (text kept opaque, an unknown kind, a shape this module does not read).
pub fn opaque_tokens(tokenizer: Tokenizer, json: &str, rules: &MediaRules) -> Option<u64> {
    let kind = opaque_type(json)?;
    match PartKind::of_type(kind) {
        PartKind::Image => Some(image_tokens(kind, json, rules)),
        PartKind::Document => document_tokens(tokenizer, json, rules),
        PartKind::Audio => Some(audio_tokens(json)),
        PartKind::Reasoning => reasoning_tokens(tokenizer, kind, json),
        PartKind::Text | PartKind::Other => None,
    }
}

/// The string value of the first `"key":"` member after `from` in compact JSON, as
/// written (escapes kept): enough for URLs, base64 and media types.
fn raw_string<'a>(json: &'a str, key: &str) -> Option<&'a str> {
    let pattern = format!("\"{key}\":\"");
    let at = json.find(&pattern)? + pattern.len();
    let rest = &json[at..];
    Some(&rest[..rest.find('"')?])
}

/// The base64 payload of a `data:` URL, or `None` for any other URL.
fn data_url_payload(url: &str) -> Option<&str> {
    let rest = url.strip_prefix("data:")?;
    Some(&rest[rest.find(";base64,")? + ";base64,".len()..])
}

/// The first `bytes` bytes (about) of base64 `payload`: whole quads only, so a prefix
/// decodes on its own.
fn decoded_prefix(payload: &str, bytes: usize) -> Vec<u8> {
    let quads = payload.len() / 4 * 4;
    let chars = (bytes.div_ceil(3) * 4).min(quads);
    let engine = &base64::engine::general_purpose::STANDARD;
    engine.decode(&payload[..chars]).unwrap_or_default()
}

/// An image's width and height from the first bytes of its file (PNG, GIF, WebP, JPEG),
/// reading more of a JPEG until its frame header, at most [`MAX_HEADER_BYTES`].
pub fn image_size(payload: &str) -> Option<(u64, u64)> {
    let mut want = 512;
    loop {
        let head = decoded_prefix(payload, want);
        match size_from_header(&head) {
            Header::Size(w, h) => return Some((w, h)),
            Header::Unknown => return None,
            Header::NeedMore if want < MAX_HEADER_BYTES && head.len() >= want => want *= 8,
            Header::NeedMore => return None,
        }
    }
}

enum Header {
    Size(u64, u64),
    NeedMore,
    Unknown,
}

fn be16(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from(u16::from_be_bytes(b.get(at..at + 2)?.try_into().ok()?)))
}

fn le16(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?)))
}

fn size_from_header(b: &[u8]) -> Header {
    let found = |size: Option<(u64, u64)>| size.map_or(Header::Unknown, |(w, h)| Header::Size(w, h));
    if b.starts_with(b"\x89PNG\r\n\x1a\n") {
        let be32 = |at: usize| {
            b.get(at..at + 4)
                .map(|s| u64::from(u32::from_be_bytes(s.try_into().unwrap())))
        };
        return found(be32(16).zip(be32(20)));
    }
    if b.starts_with(b"GIF87a") || b.starts_with(b"GIF89a") {
        return found(le16(b, 6).zip(le16(b, 8)));
    }
    if b.len() >= 30 && &b[0..4] == b"RIFF" && &b[8..12] == b"WEBP" {
        return found(match &b[12..16] {
            b"VP8 " => le16(b, 26)
                .zip(le16(b, 28))
                .map(|(w, h)| (w & 0x3fff, h & 0x3fff)),
            b"VP8L" => {
                let (b1, b2, b3, b4) = (
                    u64::from(b[21]),
                    u64::from(b[22]),
                    u64::from(b[23]),
                    u64::from(b[24]),
                );
                Some((
                    1 + (b1 | (b2 & 0x3f) << 8),
                    1 + (b2 >> 6 | b3 << 2 | (b4 & 0xf) << 10),
                ))
            }
            b"VP8X" => {
                let le24 =
                    |at: usize| u64::from(b[at]) | u64::from(b[at + 1]) << 8 | u64::from(b[at + 2]) << 16;
                Some((1 + le24(24), 1 + le24(27)))
            }
            _ => None,
        });
    }
    if b.starts_with(&[0xff, 0xd8]) {
        // Segments until a start-of-frame marker (SOF0–SOF15 but DHT, JPG, DAC).
        let mut at = 2;
        while at + 4 <= b.len() {
            if b[at] != 0xff {
                return Header::Unknown;
            }
            let marker = b[at + 1];
            if marker == 0xff {
                at += 1;
                continue;
            }
            let Some(length) = be16(b, at + 2) else {
                return Header::NeedMore;
            };
            if (0xc0..=0xcf).contains(&marker) && !matches!(marker, 0xc4 | 0xc8 | 0xcc) {
                return match (be16(b, at + 7), be16(b, at + 5)) {
                    (Some(w), Some(h)) => Header::Size(w, h),
                    _ => Header::NeedMore,
                };
            }
            at += 2 + length as usize;
        }
        return Header::NeedMore;
    }
    Header::Unknown
}

/// The tokens of an image `width × height` by `rule`; `low_detail` for OpenAI's
/// `detail: "low"`.
pub fn image_rule_tokens(rule: ImageRule, width: u64, height: u64, low_detail: bool) -> u64 {
    let (w, h) = (width.max(1) as f64, height.max(1) as f64);
    match rule {
        ImageRule::OpenAiTiles => {
            if low_detail {
                return 85;
            }
            // Fit in 2048 × 2048, then the shortest side to 768 (never up).
            let fit = (2048.0 / w.max(h)).min(1.0);
            let (w, h) = (w * fit, h * fit);
            let short = (768.0 / w.min(h)).min(1.0);
            let (w, h) = (w * short, h * short);
            let tiles = (w / 512.0).ceil() * (h / 512.0).ceil();
            85 + 170 * tiles as u64
        }
        ImageRule::AnthropicArea => {
            let fit = (1568.0 / w.max(h)).min(1.0);
            ((w * fit).round() * (h * fit).round() / 750.0).ceil() as u64
        }
    }
}

/// An image part: OpenAI's `image_url` (`url`, `detail`), Responses' `input_image`
/// (`image_url`, `detail`), Anthropic's `image` (`source`: base64 `data`, or a URL).
fn image_tokens(kind: &str, json: &str, rules: &MediaRules) -> u64 {
    let (default_rule, payload) = match kind {
        "image" => {
            let payload = match raw_string(json, "type").zip(json.find("\"source\"")) {
                Some(_) if json.contains("\"type\":\"base64\"") => raw_string(json, "data"),
                _ => None,
            };
            (ImageRule::AnthropicArea, payload)
        }
        // `image_url` is an object with a `url` (chat) or the URL itself (Responses).
        _ => {
            let url = raw_string(json, "url").or_else(|| raw_string(json, "image_url"));
            (ImageRule::OpenAiTiles, url.and_then(data_url_payload))
        }
    };
    let rule = rules.image.unwrap_or(default_rule);
    // `detail` follows the URL: read from the end, past the payload.
    let tail = &json[json.len().saturating_sub(64)..];
    let low = tail.contains("\"detail\":\"low\"");
    match payload.and_then(image_size) {
        Some((w, h)) => image_rule_tokens(rule, w, h, low),
        None if low && rule == ImageRule::OpenAiTiles => 85,
        None => rules.image_unknown.unwrap_or(match rule {
            ImageRule::OpenAiTiles => 765,
            ImageRule::AnthropicArea => 1600,
        }),
    }
}

/// A PDF's pages: the largest `/Count` of its page tree, else its `/Type /Page` objects.
pub fn pdf_pages(pdf: &[u8]) -> u64 {
    let text = String::from_utf8_lossy(pdf);
    let counts = text.match_indices("/Count").filter_map(|(at, _)| {
        let digits: String = text[at + 6..]
            .trim_start()
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse::<u64>().ok()
    });
    if let Some(max) = counts.max() {
        return max.max(1);
    }
    let pages = text
        .match_indices("/Type")
        .filter(|(at, _)| {
            let rest = text[at + 5..].trim_start();
            rest.starts_with("/Page") && !rest.starts_with("/Pages")
        })
        .count() as u64;
    pages.max(1)
}

/// A document part: a base64 PDF (Anthropic's `source`, OpenAI's `file_data`) by pages,
/// a text document (Anthropic's `source.type: "text"`) by its text.
fn document_tokens(tokenizer: Tokenizer, json: &str, rules: &MediaRules) -> Option<u64> {
    if json.contains("\"type\":\"text\"") && json.contains("\"source\"") {
        let value: serde_json::Value = serde_json::from_str(json).ok()?;
        let text = value["source"]["data"].as_str()?;
        return Some(crate::tokens::count_item(tokenizer, text));
    }
    let payload = raw_string(json, "file_data")
        .and_then(data_url_payload)
        .or_else(|| raw_string(json, "data"))?;
    let pdf = base64::engine::general_purpose::STANDARD.decode(payload).ok()?;
    if !pdf.starts_with(b"%PDF") {
        return None;
    }
    Some(pdf_pages(&pdf) * rules.document_per_page)
}

/// A WAV file's length in seconds from its header, `None` for any other format.
pub fn wav_seconds(head: &[u8]) -> Option<f64> {
    if head.len() < 44 || &head[0..4] != b"RIFF" || &head[8..12] != b"WAVE" {
        return None;
    }
    let le32 = |at: usize| u32::from_le_bytes(head[at..at + 4].try_into().unwrap());
    let byte_rate = le32(28);
    // The `data` chunk's size, after `fmt ` (and any other chunk).
    let mut at = 12;
    while at + 8 <= head.len() {
        let size = le32(at + 4) as usize;
        if &head[at..at + 4] == b"data" {
            return (byte_rate > 0).then(|| size as f64 / f64::from(byte_rate));
        }
        at += 8 + size + size % 2;
    }
    None
}

/// An audio part: seconds × [`AUDIO_TOKENS_PER_SECOND`] for a WAV, else a minute's worth.
fn audio_tokens(json: &str) -> u64 {
    raw_string(json, "data")
        .map(|payload| decoded_prefix(payload, 4096))
        .and_then(|head| wav_seconds(&head))
        .map_or(AUDIO_UNKNOWN_TOKENS, |seconds| {
            (seconds * AUDIO_TOKENS_PER_SECOND as f64).ceil() as u64
        })
}

/// Reasoning: Anthropic's `thinking` by its text, `redacted_thinking` by its bytes / 4
/// (encrypted: an estimate), a Responses `reasoning` item by its summary's text plus its
/// `encrypted_content` bytes / 4.
fn reasoning_tokens(tokenizer: Tokenizer, kind: &str, json: &str) -> Option<u64> {
    let value: serde_json::Value = serde_json::from_str(json).ok()?;
    let text = |s: &str| crate::tokens::count_item(tokenizer, s);
    let opaque = |v: &serde_json::Value| v.as_str().map_or(0, |s| s.len() as u64).div_ceil(4);
    Some(match kind {
        "thinking" => text(value["thinking"].as_str().unwrap_or("")),
        "redacted_thinking" => opaque(&value["data"]),
        _ => {
            let summary: u64 = value["summary"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|part| part["text"].as_str())
                .map(text)
                .sum();
            summary + opaque(&value["encrypted_content"])
        }
    })
}

/// A message's reasoning members (`reasoning_content`, `reasoning`: DeepSeek, vLLM,
/// OpenRouter), kept verbatim in its extra members: their text's tokens.
pub fn reasoning_member_tokens(tokenizer: Tokenizer, key: &str, json: &str) -> u64 {
    if key != "reasoning_content" && key != "reasoning" {
        return 0;
    }
    match serde_json::from_str::<serde_json::Value>(json) {
        Ok(serde_json::Value::String(text)) => crate::tokens::count_item(tokenizer, &text),
        Ok(serde_json::Value::Null) | Err(_) => 0,
        Ok(other) => crate::tokens::count_item(tokenizer, &other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(bytes: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    fn png(width: u32, height: u32) -> Vec<u8> {
        let mut out = Vec::new();
        let mut encoder = png::Encoder::new(&mut out, width, height);
        encoder.set_color(png::ColorType::Rgb);
        let mut writer = encoder.write_header().unwrap();
        writer
            .write_image_data(&vec![90u8; (width * height * 3) as usize])
            .unwrap();
        drop(writer);
        out
    }

    fn jpeg(width: u16, height: u16, exif: usize) -> Vec<u8> {
        let mut out = Vec::new();
        let mut encoder = jpeg_encoder::Encoder::new(&mut out, 80);
        // A large APP1 segment before the frame header, as a camera's EXIF is.
        for chunk in vec![7u8; exif].chunks(60_000) {
            encoder.add_app_segment(1, chunk).unwrap();
        }
        encoder
            .encode(
                &vec![120u8; width as usize * height as usize * 3],
                width,
                height,
                jpeg_encoder::ColorType::Rgb,
            )
            .unwrap();
        out
    }

    fn gif(width: u16, height: u16) -> Vec<u8> {
        let mut out = Vec::new();
        {
            let mut encoder = gif::Encoder::new(&mut out, width, height, &[]).unwrap();
            let pixels = vec![30u8; width as usize * height as usize * 3];
            encoder
                .write_frame(&gif::Frame::from_rgb(width, height, &pixels))
                .unwrap();
        }
        out
    }

    fn webp(width: u32, height: u32) -> Vec<u8> {
        let mut out = Vec::new();
        image_webp::WebPEncoder::new(&mut out)
            .encode(
                &vec![200u8; (width * height * 3) as usize],
                width,
                height,
                image_webp::ColorType::Rgb8,
            )
            .unwrap();
        out
    }

    /// A PDF of `pages` empty pages, written as a PDF writer lays one out.
    fn pdf(pages: usize) -> Vec<u8> {
        let kids: Vec<String> = (0..pages).map(|i| format!("{} 0 R", 3 + i)).collect();
        let mut text = format!(
            "%PDF-1.4\n1 0 obj << /Type /Catalog /Pages 2 0 R >> endobj\n2 0 obj << /Type /Pages /Kids [{}] /Count {pages} >> endobj\n",
            kids.join(" ")
        );
        for i in 0..pages {
            text.push_str(&format!(
                "{} 0 obj << /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] >> endobj\n",
                3 + i
            ));
        }
        text.push_str("trailer << /Root 1 0 R >>\n%%EOF\n");
        text.into_bytes()
    }

    fn openai_image(bytes: &[u8], detail: &str) -> String {
        serde_json::json!({"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{}", b64(bytes)), "detail": detail}})
            .to_string()
    }

    fn anthropic_image(bytes: &[u8]) -> String {
        serde_json::json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(bytes)}})
            .to_string()
    }

    const RULES: MediaRules = MediaRules {
        image: None,
        image_unknown: None,
        document_per_page: 1500,
    };

    #[test]
    fn image_sizes_are_read_from_each_formats_header() {
        assert_eq!(image_size(&b64(&png(1280, 800))), Some((1280, 800)));
        assert_eq!(image_size(&b64(&gif(33, 17))), Some((33, 17)));
        assert_eq!(image_size(&b64(&webp(64, 48))), Some((64, 48)));
        assert_eq!(image_size(&b64(&jpeg(40, 30, 0))), Some((40, 30)));
        // The frame header after 180 KB of EXIF: read further, still bounded.
        assert_eq!(image_size(&b64(&jpeg(40, 30, 180_000))), Some((40, 30)));
        assert_eq!(image_size(&b64(b"not an image at all")), None);
    }

    #[test]
    fn the_providers_published_examples_hold() {
        // OpenAI: a 1024 × 1024 high-detail image is 765 tokens; low detail 85.
        let square = png(1024, 1024);
        assert_eq!(
            opaque_tokens(Tokenizer::O200kBase, &openai_image(&square, "high"), &RULES),
            Some(765)
        );
        assert_eq!(
            opaque_tokens(Tokenizer::O200kBase, &openai_image(&square, "low"), &RULES),
            Some(85)
        );
        // 2048 × 4096: fit 1024 × 2048, then 768 × 1536: 2 × 3 tiles = 1,105.
        assert_eq!(image_rule_tokens(ImageRule::OpenAiTiles, 2048, 4096, false), 1105);
        // Anthropic: 1000 × 1000 is about 1,334 (w × h / 750).
        let thousand = png(1000, 1000);
        assert_eq!(
            opaque_tokens(Tokenizer::O200kBase, &anthropic_image(&thousand), &RULES),
            Some(1334)
        );
        // A model set to the other family's rule counts by it.
        let tiles = MediaRules {
            image: Some(ImageRule::OpenAiTiles),
            ..RULES
        };
        assert_eq!(
            opaque_tokens(Tokenizer::O200kBase, &anthropic_image(&square), &tiles),
            Some(765)
        );
    }

    #[test]
    fn a_url_image_costs_the_configured_unknown_and_nothing_is_tokenized() {
        let url = r#"{"type":"image_url","image_url":{"url":"https://example.com/cat.png"}}"#;
        assert_eq!(opaque_tokens(Tokenizer::O200kBase, url, &RULES), Some(765));
        let set = MediaRules {
            image_unknown: Some(300),
            ..RULES
        };
        assert_eq!(opaque_tokens(Tokenizer::O200kBase, url, &set), Some(300));
        let before = crate::tokens::bytes_tokenized();
        let big = openai_image(&png(1280, 800), "auto");
        assert!(big.len() > 4000);
        opaque_tokens(Tokenizer::O200kBase, &big, &RULES);
        // (Other tests tokenize short texts meanwhile: the counter is the process's.)
        let tokenized = crate::tokens::bytes_tokenized() - before;
        assert!(
            tokenized < big.len() as u64 / 4,
            "no base64 reaches the tokenizer: {tokenized}"
        );
    }

    #[test]
    fn a_pdf_costs_its_pages_and_a_text_document_its_text() {
        let doc = serde_json::json!({"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": b64(&pdf(7))}}).to_string();
        assert_eq!(opaque_tokens(Tokenizer::O200kBase, &doc, &RULES), Some(7 * 1500));
        let file = serde_json::json!({"type": "file", "file": {"filename": "a.pdf", "file_data": format!("data:application/pdf;base64,{}", b64(&pdf(3)))}}).to_string();
        assert_eq!(opaque_tokens(Tokenizer::O200kBase, &file, &RULES), Some(3 * 1500));
        let text = serde_json::json!({"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "hello world"}}).to_string();
        assert_eq!(opaque_tokens(Tokenizer::O200kBase, &text, &RULES), Some(2));
        assert_eq!(pdf_pages(&pdf(12)), 12);
    }

    #[test]
    fn audio_costs_its_seconds_and_reasoning_its_text() {
        // Two seconds of 16 kHz mono 16-bit WAV.
        let samples = 32_000usize;
        let mut wav = Vec::new();
        wav.extend_from_slice(b"RIFF");
        wav.extend_from_slice(&(36 + samples as u32 * 2).to_le_bytes());
        wav.extend_from_slice(b"WAVEfmt ");
        wav.extend_from_slice(&16u32.to_le_bytes());
        wav.extend_from_slice(&1u16.to_le_bytes());
        wav.extend_from_slice(&1u16.to_le_bytes());
        wav.extend_from_slice(&16_000u32.to_le_bytes());
        wav.extend_from_slice(&32_000u32.to_le_bytes());
        wav.extend_from_slice(&2u16.to_le_bytes());
        wav.extend_from_slice(&16u16.to_le_bytes());
        wav.extend_from_slice(b"data");
        wav.extend_from_slice(&(samples as u32 * 2).to_le_bytes());
        wav.extend(std::iter::repeat_n(0u8, samples * 2));
        let audio =
            serde_json::json!({"type": "input_audio", "input_audio": {"data": b64(&wav), "format": "wav"}})
                .to_string();
        assert_eq!(opaque_tokens(Tokenizer::O200kBase, &audio, &RULES), Some(20));

        let thinking = r#"{"type":"thinking","thinking":"hello world","signature":"EqQBCkgIARABGAIiQ"}"#;
        assert_eq!(opaque_tokens(Tokenizer::O200kBase, thinking, &RULES), Some(2));
        let redacted = r#"{"type":"redacted_thinking","data":"0123456789abcdef"}"#;
        assert_eq!(opaque_tokens(Tokenizer::O200kBase, redacted, &RULES), Some(4));
        let item = r#"{"type":"reasoning","summary":[{"type":"summary_text","text":"hello world"}],"encrypted_content":"12345678"}"#;
        assert_eq!(opaque_tokens(Tokenizer::O200kBase, item, &RULES), Some(2 + 2));
        assert_eq!(
            reasoning_member_tokens(Tokenizer::O200kBase, "reasoning_content", "\"hello world\""),
            2
        );
        assert_eq!(
            reasoning_member_tokens(Tokenizer::O200kBase, "other", "\"hello world\""),
            0
        );
        assert_eq!(
            opaque_tokens(Tokenizer::O200kBase, r#"{"type":"web_search_call"}"#, &RULES),
            None
        );
    }
}
