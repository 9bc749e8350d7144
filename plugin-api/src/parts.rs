//! What a content part is (docs/wire-format.md#parts): text, an image, a document, audio,
//! reasoning, or something else, read from an opaque part's `"type"` without parsing its
//! payload (a base64 image is never walked). Additive to the ABI: the parts stay
//! [`Part::Text`] and [`Part::Opaque`]; this only reads them.

use crate::message::Part;

/// The kind of a content part, as the host counts and the media plugins manage it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartKind {
    /// A text part (OpenAI's and Anthropic's `text`, Responses' `input_text` /
    /// `output_text` when kept opaque).
    Text,
    /// OpenAI's `image_url`, Responses' `input_image`, Anthropic's `image`.
    Image,
    /// Anthropic's `document`, OpenAI's `file`, Responses' `input_file`.
    Document,
    /// OpenAI's `input_audio`.
    Audio,
    /// Anthropic's `thinking` and `redacted_thinking`, a Responses `reasoning` item.
    Reasoning,
    /// Any other part: kept verbatim, counted as its JSON text.
    Other,
}

impl PartKind {
    /// The kind of an opaque part whose `"type"` is `kind`.
    pub fn of_type(kind: &str) -> PartKind {
        match kind {
            "text" | "input_text" | "output_text" => PartKind::Text,
            "image_url" | "input_image" | "image" => PartKind::Image,
            "document" | "file" | "input_file" => PartKind::Document,
            "input_audio" => PartKind::Audio,
            "thinking" | "redacted_thinking" | "reasoning" => PartKind::Reasoning,
            _ => PartKind::Other,
        }
    }

    /// Images, documents and audio: what `media_filter` may replace by a placeholder.
    pub fn is_media(self) -> bool {
        matches!(self, PartKind::Image | PartKind::Document | PartKind::Audio)
    }
}

impl Part {
    /// The part's kind ([`PartKind`]).
    pub fn kind(&self) -> PartKind {
        match self {
            Part::Text { .. } => PartKind::Text,
            Part::Opaque { json } => opaque_type(json).map_or(PartKind::Other, PartKind::of_type),
        }
    }
}

/// The `"type"` of an opaque part's compact JSON: the value of the first `"type"` member,
/// which is the part's own when it comes first, as every client writes it. Found by a
/// search, never by parsing: a part whose `type` follows a large payload costs one scan
/// for the key (base64 has no `"`), none of the payload's decoding.
pub fn opaque_type(json: &str) -> Option<&str> {
    let at = json.find("\"type\":\"")? + "\"type\":\"".len();
    let rest = &json[at..];
    let end = rest.find('"')?;
    Some(&rest[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_told_apart_by_their_type() {
        let opaque = |json: &str| Part::Opaque { json: json.into() }.kind();
        assert_eq!(Part::text("hi").kind(), PartKind::Text);
        assert_eq!(
            opaque(r#"{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBOR"}}"#),
            PartKind::Image
        );
        assert_eq!(
            opaque(r#"{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBOR"}}"#),
            PartKind::Image
        );
        assert_eq!(
            opaque(r#"{"type":"document","source":{"type":"text","data":"x"}}"#),
            PartKind::Document
        );
        assert_eq!(
            opaque(r#"{"type":"input_audio","input_audio":{"data":"UklG","format":"wav"}}"#),
            PartKind::Audio
        );
        assert_eq!(
            opaque(r#"{"type":"thinking","thinking":"hm","signature":"s"}"#),
            PartKind::Reasoning
        );
        assert_eq!(opaque(r#"{"type":"web_search_call","id":"w"}"#), PartKind::Other);
        assert_eq!(opaque(r#"{"no_type":1}"#), PartKind::Other);
        assert!(PartKind::Image.is_media() && !PartKind::Reasoning.is_media());
    }
}
