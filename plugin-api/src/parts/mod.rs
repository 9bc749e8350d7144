//! The kinds of a message's parts and what each costs (docs/wire-format.md#part-kinds).
//!
//! Additive to the ABI: [`Part`] keeps its two variants, and a part the host does not
//! model as text stays [`Part::Opaque`], its JSON verbatim; its kind is read from its
//! JSON `"type"` ([`Part::kind`]). Reading a kind or an image's size never parses a
//! payload: the members are read from the head and tail of the JSON text (`scan`), the
//! payload's header by random access into its base64 (`probe`).

mod probe;
pub mod samples;
mod scan;

use std::borrow::Cow;

use serde_json::Value;

use crate::message::{Message, Part};

pub use probe::ImageFormat;
use probe::B64;

/// What a part is (docs/wire-format.md#part-kinds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PartKind {
    /// A `text` part ([`Part::Text`]).
    Text,
    /// OpenAI `image_url`, Responses `input_image`, Anthropic `image`.
    Image,
    /// Anthropic `document`, OpenAI `file`, Responses `input_file`.
    Document,
    /// OpenAI `input_audio`.
    Audio,
    /// Anthropic `thinking`, `redacted_thinking`, a Responses `reasoning` item.
    Reasoning,
    /// Anything else: counted as its JSON text.
    Other,
}

impl PartKind {
    pub fn as_str(self) -> &'static str {
        match self {
            PartKind::Text => "text",
            PartKind::Image => "image",
            PartKind::Document => "document",
            PartKind::Audio => "audio",
            PartKind::Reasoning => "reasoning",
            PartKind::Other => "other",
        }
    }

    fn of_type(name: &str) -> PartKind {
        match name {
            "image_url" | "input_image" | "image" => PartKind::Image,
            "file" | "input_file" | "document" => PartKind::Document,
            "input_audio" => PartKind::Audio,
            "thinking" | "redacted_thinking" | "reasoning" => PartKind::Reasoning,
            _ => PartKind::Other,
        }
    }
}

/// A model's rule for an image's tokens (`image_tokens`, docs/configuration.md#models).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ImageTokens {
    /// OpenAI's: low detail 85; else fit in 2048×2048, shortest side to 768, then
    /// 85 + 170 per 512-px tile.
    OpenaiTiles,
    /// Anthropic's: width × height / 750 after fitting the long side in 1568 px.
    AnthropicArea,
}

impl ImageTokens {
    pub fn parse(name: &str) -> Option<ImageTokens> {
        match name {
            "openai-tiles" => Some(ImageTokens::OpenaiTiles),
            "anthropic-area" => Some(ImageTokens::AnthropicArea),
            _ => None,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            ImageTokens::OpenaiTiles => "openai-tiles",
            ImageTokens::AnthropicArea => "anthropic-area",
        }
    }

    /// The tokens of a `width` × `height` image (`low`: OpenAI's `detail: "low"`).
    pub fn tokens(self, width: u32, height: u32, low: bool) -> u64 {
        let (w, h) = (f64::from(width.max(1)), f64::from(height.max(1)));
        match self {
            ImageTokens::OpenaiTiles if low => 85,
            ImageTokens::OpenaiTiles => {
                let fit = (2048.0 / w.max(h)).min(1.0);
                let (w, h) = (w * fit, h * fit);
                let short = (768.0 / w.min(h)).min(1.0);
                let (w, h) = ((w * short).round(), (h * short).round());
                let tiles = (w / 512.0).ceil() * (h / 512.0).ceil();
                85 + 170 * tiles as u64
            }
            ImageTokens::AnthropicArea => {
                let fit = (1568.0 / w.max(h)).min(1.0);
                let (w, h) = ((w * fit).round(), (h * fit).round());
                (w * h / 750.0).ceil() as u64
            }
        }
    }
}

/// Tokens per second of audio, the family default (OpenAI bills audio input at about one
/// token per 100 ms): a model's `audio_tokens_per_second` replaces it.
pub const AUDIO_TOKENS_PER_SECOND: u64 = 10;
/// Bytes per second assumed for compressed audio (128 kbit/s) whose header is not read.
const AUDIO_BYTES_PER_SECOND: f64 = 16_000.0;
/// Bytes of a PDF per page assumed when its page tree is not readable.
const PDF_BYTES_PER_PAGE: u64 = 50_000;

/// A model's rules for what is not text (`[models.NAME]`, docs/configuration.md#models).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MediaRules {
    pub image_tokens: ImageTokens,
    /// An image whose size is not known (a URL, a file id, an unreadable header).
    pub image_tokens_unknown: u64,
    pub document_tokens_per_page: u64,
    /// Tokens per second of audio whose duration is known (`audio_tokens_per_second`).
    pub audio_tokens_per_second: u64,
    /// The tokens of audio whose header gives no duration (`audio_tokens_unknown`); when
    /// not configured, its duration is estimated from its size at 128 kbit/s.
    pub audio_tokens_unknown: Option<u64>,
}

impl MediaRules {
    /// OpenAI's family.
    pub const OPENAI: MediaRules = MediaRules {
        image_tokens: ImageTokens::OpenaiTiles,
        image_tokens_unknown: 765,
        document_tokens_per_page: 1_500,
        audio_tokens_per_second: AUDIO_TOKENS_PER_SECOND,
        audio_tokens_unknown: None,
    };
    /// Anthropic's family.
    pub const ANTHROPIC: MediaRules = MediaRules {
        image_tokens: ImageTokens::AnthropicArea,
        image_tokens_unknown: 1_600,
        document_tokens_per_page: 2_000,
        audio_tokens_per_second: AUDIO_TOKENS_PER_SECOND,
        audio_tokens_unknown: None,
    };

    /// The defaults of the family a model name belongs to: Anthropic's for a name with
    /// `claude` in it, OpenAI's for any other.
    pub fn for_model(name: &str) -> MediaRules {
        if name.to_ascii_lowercase().contains("claude") {
            MediaRules::ANTHROPIC
        } else {
            MediaRules::OPENAI
        }
    }
}

/// An image part's header facts (for a placeholder such as `[image omitted: 1280×800 png]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageInfo {
    pub format: ImageFormat,
    pub width: u32,
    pub height: u32,
    /// OpenAI's `detail: "low"`.
    pub low_detail: bool,
}

/// What a part costs: fixed tokens plus texts the caller's tokenizer counts.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct PartCost<'a> {
    pub tokens: u64,
    pub texts: Vec<Cow<'a, str>>,
}

impl PartCost<'_> {
    fn fixed(tokens: u64) -> Self {
        PartCost {
            tokens,
            texts: Vec::new(),
        }
    }
}

impl Part {
    /// The part's kind, from its JSON `"type"` for an opaque part (read from the head or
    /// tail of its text, never by parsing a payload).
    pub fn kind(&self) -> PartKind {
        match self {
            Part::Text { .. } => PartKind::Text,
            Part::Opaque { json } => PartKind::of_type(type_name(json).unwrap_or("")),
        }
    }

    /// An opaque part's JSON `"type"`, if it has a string one.
    pub fn type_name(&self) -> Option<&str> {
        match self {
            Part::Text { .. } => Some("text"),
            Part::Opaque { json } => type_name(json),
        }
    }

    /// An image part's format and size from its header; `None` for another kind or an
    /// image whose size is not in the message (a URL, a file id).
    pub fn image_info(&self) -> Option<ImageInfo> {
        let Part::Opaque { json } = self else { return None };
        let s = scan::scan(json);
        let (data, low) = image_data(&s)?;
        let (format, width, height) = probe::image_size(&B64::new(data?))?;
        Some(ImageInfo {
            format,
            width,
            height,
            low_detail: low,
        })
    }

    /// What the part costs under `rules` (docs/wire-format.md#part-kinds). Base64 is never
    /// among the texts.
    pub fn cost(&self, rules: &MediaRules) -> PartCost<'_> {
        let json = match self {
            Part::Text { text, .. } => {
                return PartCost {
                    tokens: 0,
                    texts: vec![Cow::Borrowed(text.as_str())],
                }
            }
            Part::Opaque { json } => json.as_str(),
        };
        let s = scan::scan(json);
        let kind = if s.broken {
            PartKind::of_type(type_name(json).unwrap_or(""))
        } else {
            PartKind::of_type(s.get(1, "type").unwrap_or(""))
        };
        let cost = match kind {
            PartKind::Image => Some(image_cost(&s, rules)),
            PartKind::Document => document_cost(&s, json, rules),
            PartKind::Audio => Some(audio_cost(&s, rules)),
            PartKind::Reasoning => reasoning_cost(json),
            PartKind::Text | PartKind::Other => None,
        };
        cost.unwrap_or_else(|| PartCost {
            tokens: 0,
            texts: vec![Cow::Borrowed(json)],
        })
    }
}

/// The `"type"` of an opaque part's JSON: from the scan, or (when the text is not what
/// the scan reads) from a full parse.
fn type_name(json: &str) -> Option<&str> {
    let s = scan::scan(json);
    if !s.broken {
        return s.get(1, "type");
    }
    // Rare (a long string inside an array before the type): parse, and find the same
    // text in the JSON so the answer borrows from it.
    let value: Value = serde_json::from_str(json).ok()?;
    let name = value.get("type")?.as_str()?;
    let needle = format!("\"type\":\"{name}\"");
    json.find(&needle).map(|at| &json[at + 8..at + 8 + name.len()])
}

/// An image's base64 (when in the message) and whether it is low detail.
fn image_data<'a>(s: &scan::Scan<'a>) -> Option<(Option<&'a str>, bool)> {
    let (url, detail) = match s.get(1, "type")? {
        "image_url" => (
            s.string(2, "url").or_else(|| s.string(1, "image_url")),
            s.get(2, "detail").or_else(|| s.get(1, "detail")),
        ),
        "input_image" => (s.string(1, "image_url"), s.get(1, "detail")),
        "image" => {
            let data = (s.get(2, "type") == Some("base64"))
                .then(|| s.string(2, "data"))
                .flatten();
            return Some((data, false));
        }
        _ => return None,
    };
    Some((url.and_then(data_url_base64), detail == Some("low")))
}

/// The base64 of a `data:…;base64,` URL.
fn data_url_base64(url: &str) -> Option<&str> {
    let rest = url.strip_prefix("data:")?;
    let comma = rest.get(..256.min(rest.len()))?.find(',')?;
    rest[..comma].ends_with(";base64").then(|| &rest[comma + 1..])
}

fn image_cost(s: &scan::Scan<'_>, rules: &MediaRules) -> PartCost<'static> {
    let Some((data, low)) = image_data(s) else {
        return PartCost::fixed(rules.image_tokens_unknown);
    };
    if low && rules.image_tokens == ImageTokens::OpenaiTiles {
        return PartCost::fixed(85);
    }
    match data.and_then(|d| probe::image_size(&B64::new(d))) {
        Some((_, w, h)) => PartCost::fixed(rules.image_tokens.tokens(w, h, low)),
        None => PartCost::fixed(rules.image_tokens_unknown),
    }
}

fn document_cost<'a>(s: &scan::Scan<'a>, json: &'a str, rules: &MediaRules) -> Option<PartCost<'a>> {
    let data = match s.get(1, "type")? {
        "document" => match s.get(2, "type")? {
            "base64" => s.string(2, "data"),
            // A text document: its text, counted by the tokenizer.
            "text" => {
                let value: Value = serde_json::from_str(json).ok()?;
                let text = value.get("source")?.get("data")?.as_str()?.to_string();
                return Some(PartCost {
                    tokens: 0,
                    texts: vec![Cow::Owned(text)],
                });
            }
            // A URL or content blocks: counted as their JSON text.
            _ => return None,
        },
        "file" => s.string(2, "file_data").and_then(data_url_base64),
        "input_file" => s.string(1, "file_data").and_then(data_url_base64),
        _ => None,
    };
    let pages = match data {
        Some(data) => {
            let data = B64::new(data);
            probe::pdf_pages(&data).unwrap_or_else(|| (data.len() as u64).div_ceil(PDF_BYTES_PER_PAGE).max(1))
        }
        // A file id or URL: its size is not in the message; one page, an estimate.
        None => 1,
    };
    Some(PartCost::fixed(pages * rules.document_tokens_per_page))
}

/// Audio: its duration from a WAV header × the model's rate; audio whose header gives no
/// duration costs the model's `audio_tokens_unknown`, else its size at 128 kbit/s × the rate.
fn audio_cost(s: &scan::Scan<'_>, rules: &MediaRules) -> PartCost<'static> {
    let Some(data) = s.string(2, "data") else {
        return PartCost::fixed(0);
    };
    let data = B64::new(data);
    let seconds = match (probe::wav_seconds(&data), rules.audio_tokens_unknown) {
        (Some(seconds), _) => seconds,
        (None, Some(tokens)) => return PartCost::fixed(tokens),
        (None, None) => data.len() as f64 / AUDIO_BYTES_PER_SECOND,
    };
    PartCost::fixed((seconds * rules.audio_tokens_per_second as f64).ceil() as u64)
}

/// Reasoning: its text by the tokenizer, opaque or encrypted reasoning (a `thinking`
/// block's `signature` too: it is sent back and read by the provider) as bytes / 4 (an
/// estimate: the provider's count is not visible).
fn reasoning_cost(json: &str) -> Option<PartCost<'static>> {
    let value: Value = serde_json::from_str(json).ok()?;
    let opaque = |key: &str| {
        value
            .get(key)
            .and_then(Value::as_str)
            .map_or(0, |t| (t.len() as u64).div_ceil(4))
    };
    let mut cost = PartCost::default();
    match value.get("type")?.as_str()? {
        "thinking" => {
            cost.texts
                .push(Cow::Owned(value.get("thinking")?.as_str()?.to_string()));
            cost.tokens = opaque("signature");
        }
        "redacted_thinking" => cost.tokens = opaque("data"),
        "reasoning" => {
            for list in ["summary", "content"] {
                for item in value.get(list).and_then(Value::as_array).into_iter().flatten() {
                    if let Some(text) = item.get("text").and_then(Value::as_str) {
                        cost.texts.push(Cow::Owned(text.to_string()));
                    }
                }
            }
            cost.tokens = opaque("encrypted_content");
        }
        _ => return None,
    }
    Some(cost)
}

/// Keys of an assistant message's reasoning text kept in `extra` (DeepSeek, vLLM,
/// OpenRouter).
pub const REASONING_MEMBERS: [&str; 2] = ["reasoning_content", "reasoning"];

impl Message {
    /// The texts of the message's `reasoning_content` / `reasoning` members (kept in
    /// `extra` as JSON strings); a member of another type is not reasoning text.
    pub fn reasoning_texts(&self) -> impl Iterator<Item = String> + '_ {
        self.extra
            .iter()
            .filter(|m| REASONING_MEMBERS.contains(&m.key.as_str()) && m.json.starts_with('"'))
            .filter_map(|m| serde_json::from_str::<String>(&m.json).ok())
    }
}

#[cfg(test)]
mod tests;
