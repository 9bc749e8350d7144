//! What the host reads from a part's base64 payload without decoding it
//! (docs/wire-format.md#part-kinds): an image's pixel size from its header (PNG, JPEG, GIF,
//! WebP), a PDF's page count from its page tree, a WAV file's duration. Base64 is read by
//! random access (byte `i` lives in the four characters at `4 * (i / 3)`), so a JPEG's
//! segments are skipped without decoding what lies between, and every read is bounded.

/// Base64 text read by random access.
pub(crate) struct B64<'a> {
    chars: &'a [u8],
}

fn sextet(c: u8) -> Option<u32> {
    Some(match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' | b'-' => 62,
        b'/' | b'_' => 63,
        _ => return None,
    } as u32)
}

impl<'a> B64<'a> {
    pub fn new(text: &'a str) -> B64<'a> {
        B64 {
            chars: text.as_bytes(),
        }
    }

    /// Decoded length (an upper bound by at most 2 when padded).
    pub fn len(&self) -> usize {
        let pad = self.chars.iter().rev().take_while(|c| **c == b'=').count();
        (self.chars.len() / 4 * 3 + (self.chars.len() % 4) * 3 / 4).saturating_sub(pad)
    }

    /// Decoded byte `i`, `None` past the end or on a character that is not base64.
    pub fn byte(&self, i: usize) -> Option<u8> {
        if i >= self.len() {
            return None;
        }
        let group = i / 3;
        let at = group.checked_mul(4)?;
        let quad = self.chars.get(at..(at + 4).min(self.chars.len()))?;
        let mut word = 0u32;
        for k in 0..4 {
            let v = match quad.get(k) {
                Some(b'=') | None => 0,
                Some(&c) => sextet(c)?,
            };
            word = (word << 6) | v;
        }
        Some((word >> (16 - 8 * (i % 3))) as u8)
    }

    /// Decoded bytes `start..start + n` (shorter at the end).
    pub fn bytes(&self, start: usize, n: usize) -> Vec<u8> {
        (start..start.saturating_add(n))
            .map_while(|i| self.byte(i))
            .collect()
    }
}

/// An image format read from its header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageFormat {
    Png,
    Jpeg,
    Gif,
    Webp,
}

impl ImageFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            ImageFormat::Png => "png",
            ImageFormat::Jpeg => "jpeg",
            ImageFormat::Gif => "gif",
            ImageFormat::Webp => "webp",
        }
    }
}

fn be16(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from(u16::from_be_bytes(b.get(at..at + 2)?.try_into().ok()?)))
}
fn le16(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?)))
}
fn be32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}
fn le32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}
fn le24(b: &[u8], at: usize) -> Option<u32> {
    let s = b.get(at..at + 3)?;
    Some(u32::from(s[0]) | u32::from(s[1]) << 8 | u32::from(s[2]) << 16)
}

/// Most segments a JPEG's walk to its frame header visits before it gives up.
const JPEG_SEGMENTS: usize = 64;

/// An image's format and pixel size from its header; `None` for another format or a
/// header that does not say.
pub fn image_size(data: &B64<'_>) -> Option<(ImageFormat, u32, u32)> {
    let head = data.bytes(0, 32);
    if head.starts_with(b"\x89PNG\r\n\x1a\n") && head.get(12..16) == Some(b"IHDR") {
        return Some((ImageFormat::Png, be32(&head, 16)?, be32(&head, 20)?));
    }
    if head.starts_with(b"GIF87a") || head.starts_with(b"GIF89a") {
        return Some((ImageFormat::Gif, le16(&head, 6)?, le16(&head, 8)?));
    }
    if head.starts_with(b"RIFF") && head.get(8..12) == Some(b"WEBP") {
        let (w, h) = match head.get(12..16)? {
            b"VP8X" => (le24(&head, 24)? + 1, le24(&head, 27)? + 1),
            b"VP8 " => (le16(&head, 26)? & 0x3fff, le16(&head, 28)? & 0x3fff),
            b"VP8L" => {
                let bits = le32(&head, 21)?;
                ((bits & 0x3fff) + 1, ((bits >> 14) & 0x3fff) + 1)
            }
            _ => return None,
        };
        return Some((ImageFormat::Webp, w, h));
    }
    if head.starts_with(b"\xff\xd8") {
        return jpeg_size(data).map(|(w, h)| (ImageFormat::Jpeg, w, h));
    }
    None
}

/// Walks a JPEG's segments to its frame header (SOF0..SOF15 but DHT, JPG, DAC), reading
/// four bytes per segment.
fn jpeg_size(data: &B64<'_>) -> Option<(u32, u32)> {
    let mut at = 2usize;
    for _ in 0..JPEG_SEGMENTS {
        let head = data.bytes(at, 4);
        if head.len() < 4 || head[0] != 0xff {
            return None;
        }
        let marker = head[1];
        if marker == 0xff {
            at += 1; // fill byte
            continue;
        }
        let length = be16(&head, 2)? as usize;
        if (0xc0..=0xcf).contains(&marker) && ![0xc4, 0xc8, 0xcc].contains(&marker) {
            let frame = data.bytes(at + 5, 4);
            return Some((be16(&frame, 2)?, be16(&frame, 0)?));
        }
        if marker == 0xd9 || marker == 0xda {
            return None;
        }
        at = at.checked_add(2 + length)?;
    }
    None
}

/// Most decoded bytes a PDF's page count reads.
const PDF_SCAN: usize = 16 << 20;

/// A PDF's page count: the largest `/Count` of a `/Type /Pages` node (the root's), else
/// the `/Type /Page` objects; `None` when neither is readable (a PDF whose page tree sits
/// in compressed object streams), or the data is not a PDF.
pub fn pdf_pages(data: &B64<'_>) -> Option<u64> {
    if data.bytes(0, 5) != b"%PDF-" {
        return None;
    }
    let bytes = data.bytes(0, PDF_SCAN);
    let mut max_count = None::<u64>;
    let mut pages = 0u64;
    let mut i = 0;
    while let Some(found) = find(&bytes[i..], b"/Type") {
        let mut j = i + found + 5;
        while bytes.get(j).is_some_and(|b| b.is_ascii_whitespace()) {
            j += 1;
        }
        if bytes[j..].starts_with(b"/Pages") {
            // The node's object: from its `obj` to its `endobj` (each looked for nearby).
            let t = i + found;
            let low = t.saturating_sub(4096);
            let start = rfind(&bytes[low..t], b"obj").map_or(low, |k| low + k);
            let high = (t + 4096).min(bytes.len());
            let end = find(&bytes[t..high], b"endobj").map_or(high, |k| t + k);
            if let Some(count) = number_after(&bytes[start..end], b"/Count") {
                max_count = Some(max_count.map_or(count, |m| m.max(count)));
            }
        } else if bytes[j..].starts_with(b"/Page") {
            pages += 1;
        }
        i = j;
    }
    max_count.or((pages > 0).then_some(pages))
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn rfind(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).rposition(|w| w == needle)
}

fn number_after(hay: &[u8], key: &[u8]) -> Option<u64> {
    let at = find(hay, key)? + key.len();
    let digits: String = hay[at..]
        .iter()
        .skip_while(|b| b.is_ascii_whitespace())
        .take_while(|b| b.is_ascii_digit())
        .map(|b| *b as char)
        .collect();
    digits.parse().ok()
}

/// A WAV file's duration in seconds, from its `fmt ` byte rate and `data` size.
pub fn wav_seconds(data: &B64<'_>) -> Option<f64> {
    let head = data.bytes(0, 12);
    if !(head.starts_with(b"RIFF") && head.get(8..12) == Some(b"WAVE")) {
        return None;
    }
    let (mut at, mut byte_rate) = (12usize, None);
    for _ in 0..16 {
        let chunk = data.bytes(at, 8);
        let size = le32(&chunk, 4)? as usize;
        match chunk.get(0..4)? {
            b"fmt " => byte_rate = le32(&data.bytes(at + 8, 16), 8),
            b"data" => {
                let rate = byte_rate.filter(|r| *r > 0)?;
                // A streamed WAV may say 0 or all ones: then the payload's own length.
                let size = if size == 0 || size == u32::MAX as usize {
                    data.len().saturating_sub(at + 8)
                } else {
                    size
                };
                return Some(size as f64 / f64::from(rate));
            }
            _ => {}
        }
        at = at.checked_add(8 + size + size % 2)?;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parts::samples::base64 as b64;

    #[test]
    fn random_access_decodes_like_a_decoder() {
        let bytes: Vec<u8> = (0..=255u8).chain(0..100).collect();
        let text = b64(&bytes);
        let data = B64::new(&text);
        assert_eq!(data.len(), bytes.len());
        assert_eq!(data.bytes(0, 400), bytes);
        assert_eq!(data.byte(200), Some(bytes[200]));
        assert_eq!(data.byte(356), None);
    }

    #[test]
    fn garbage_says_nothing_and_never_panics() {
        for text in [
            "",
            "=",
            "AAAA",
            "/9j/",
            "iVBORw0KGgo=",
            "UklGR",
            "JVBERi0",
            "!!!!",
        ] {
            let data = B64::new(text);
            assert_eq!(image_size(&data), None);
            assert_eq!(pdf_pages(&data), None);
            assert_eq!(wav_seconds(&data), None);
        }
    }
}
