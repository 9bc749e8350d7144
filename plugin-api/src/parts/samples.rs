//! Real small media files made in code, for tests and benchmarks (docs/wire-format.md#part-kinds):
//! a PNG any image reader decodes (stored deflate blocks), JPEG, GIF and WebP files whose
//! headers are the formats' own, a PDF with a page tree of N pages, a PCM WAV file, and
//! the base64 and part JSON that carry them.

/// Standard base64 with padding.
pub fn base64(bytes: &[u8]) -> String {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let w = (u32::from(chunk[0]) << 16)
            | (u32::from(*chunk.get(1).unwrap_or(&0)) << 8)
            | u32::from(*chunk.get(2).unwrap_or(&0));
        for k in 0..4 {
            out.push(if k <= chunk.len() {
                A[(w >> (18 - 6 * k)) as usize & 63] as char
            } else {
                '='
            });
        }
    }
    out
}

fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

fn png_chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    let start = out.len();
    out.extend_from_slice(kind);
    out.extend_from_slice(data);
    let crc = crc32(&out[start..]);
    out.extend_from_slice(&crc.to_be_bytes());
}

/// A black `width` × `height` PNG (8-bit greyscale), its pixels compressed by a fixed-
/// Huffman deflate block (runs of zeros as copies of distance 1): a real PNG of a few
/// kilobytes even at screen size.
pub fn png(width: u32, height: u32) -> Vec<u8> {
    let raw_len = (width as usize + 1) * height as usize;
    let mut bits = BitWriter::default();
    bits.put(1, 1); // BFINAL
    bits.put(1, 2); // BTYPE = 01, fixed Huffman
    bits.code(0x30, 8); // literal 0
    let mut left = raw_len - 1;
    while left >= 258 {
        bits.code(0xc5, 8); // length 258 (code 285)
        bits.code(0, 5); // distance 1
        left -= 258;
    }
    for _ in 0..left {
        bits.code(0x30, 8);
    }
    bits.code(0, 7); // end of block
    let mut zlib = vec![0x78, 0x01];
    zlib.extend_from_slice(&bits.finish());
    // Adler-32 of zeros: a stays 1, b grows by 1 per byte.
    let adler = ((raw_len % 65_521) as u32) << 16 | 1;
    zlib.extend_from_slice(&adler.to_be_bytes());
    png_file(width, height, &zlib)
}

/// A `width` × `height` greyscale PNG of noise-like pixels in stored (uncompressed)
/// deflate blocks: about `width × height` bytes, for measuring big payloads.
pub fn png_stored(width: u32, height: u32) -> Vec<u8> {
    let mut raw = Vec::with_capacity((width as usize + 1) * height as usize);
    for y in 0..height {
        raw.push(0); // filter: none
        raw.extend((0..width).map(|x| (x.wrapping_mul(31) ^ y.wrapping_mul(17)) as u8));
    }
    let mut zlib = vec![0x78, 0x01];
    let blocks: Vec<&[u8]> = raw.chunks(65_535).collect();
    for (i, block) in blocks.iter().enumerate() {
        zlib.push(u8::from(i + 1 == blocks.len()));
        let len = block.len() as u16;
        zlib.extend_from_slice(&len.to_le_bytes());
        zlib.extend_from_slice(&(!len).to_le_bytes());
        zlib.extend_from_slice(block);
    }
    let (mut a, mut b) = (1u32, 0u32);
    for &byte in &raw {
        a = (a + u32::from(byte)) % 65_521;
        b = (b + a) % 65_521;
    }
    zlib.extend_from_slice(&((b << 16) | a).to_be_bytes());
    png_file(width, height, &zlib)
}

fn png_file(width: u32, height: u32, zlib: &[u8]) -> Vec<u8> {
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&width.to_be_bytes());
    ihdr.extend_from_slice(&height.to_be_bytes());
    ihdr.extend_from_slice(&[8, 0, 0, 0, 0]);
    png_chunk(&mut out, b"IHDR", &ihdr);
    png_chunk(&mut out, b"IDAT", zlib);
    png_chunk(&mut out, b"IEND", &[]);
    out
}

/// Deflate's bit order: values least significant bit first, Huffman codes most
/// significant bit first.
#[derive(Default)]
struct BitWriter {
    out: Vec<u8>,
    byte: u8,
    used: u8,
}

impl BitWriter {
    fn bit(&mut self, bit: u32) {
        self.byte |= ((bit & 1) as u8) << self.used;
        self.used += 1;
        if self.used == 8 {
            self.out.push(self.byte);
            (self.byte, self.used) = (0, 0);
        }
    }
    fn put(&mut self, value: u32, len: u32) {
        (0..len).for_each(|i| self.bit(value >> i));
    }
    fn code(&mut self, code: u32, len: u32) {
        (0..len).rev().for_each(|i| self.bit(code >> i));
    }
    fn finish(mut self) -> Vec<u8> {
        if self.used > 0 {
            self.out.push(self.byte);
        }
        self.out
    }
}

/// A baseline JPEG's headers: JFIF, an `exif_bytes`-long APP1 segment before the frame
/// (as a camera's EXIF puts it), DQT, the SOF0 frame with the size, EOI.
pub fn jpeg(width: u16, height: u16, exif_bytes: u16) -> Vec<u8> {
    let mut out = vec![0xff, 0xd8];
    out.extend_from_slice(&[
        0xff, 0xe0, 0, 16, b'J', b'F', b'I', b'F', 0, 1, 1, 0, 0, 1, 0, 1, 0, 0,
    ]);
    let exif = exif_bytes.max(8);
    out.extend_from_slice(&[0xff, 0xe1]);
    out.extend_from_slice(&exif.to_be_bytes());
    out.extend_from_slice(b"Exif\0\0");
    out.resize(out.len() + exif as usize - 8, 0);
    out.extend_from_slice(&[0xff, 0xdb, 0, 67, 0]);
    out.resize(out.len() + 64, 1);
    out.extend_from_slice(&[0xff, 0xc0, 0, 11, 8]);
    out.extend_from_slice(&height.to_be_bytes());
    out.extend_from_slice(&width.to_be_bytes());
    out.extend_from_slice(&[1, 1, 0x11, 0]);
    out.extend_from_slice(&[0xff, 0xd9]);
    out
}

/// A GIF89a's header and logical screen.
pub fn gif(width: u16, height: u16) -> Vec<u8> {
    let mut out = b"GIF89a".to_vec();
    out.extend_from_slice(&width.to_le_bytes());
    out.extend_from_slice(&height.to_le_bytes());
    out.extend_from_slice(&[0, 0, 0, 0x3b]);
    out
}

/// An extended WebP (`VP8X`) header with its canvas size.
pub fn webp(width: u32, height: u32) -> Vec<u8> {
    let mut chunk = vec![0u8; 4];
    chunk.extend_from_slice(&(width - 1).to_le_bytes()[..3]);
    chunk.extend_from_slice(&(height - 1).to_le_bytes()[..3]);
    let mut out = b"RIFF".to_vec();
    out.extend_from_slice(&(4 + 8 + chunk.len() as u32).to_le_bytes());
    out.extend_from_slice(b"WEBPVP8X");
    out.extend_from_slice(&(chunk.len() as u32).to_le_bytes());
    out.extend_from_slice(&chunk);
    out
}

/// A PDF with `pages` empty pages in one page tree, with its cross-reference table.
pub fn pdf(pages: usize) -> Vec<u8> {
    let mut objects = vec![
        "<< /Type /Catalog /Pages 2 0 R >>".to_string(),
        format!(
            "<< /Type /Pages /Kids [{}] /Count {pages} >>",
            (0..pages)
                .map(|i| format!("{} 0 R", i + 3))
                .collect::<Vec<_>>()
                .join(" ")
        ),
    ];
    objects.extend((0..pages).map(|_| "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] >>".to_string()));
    let mut out = String::from("%PDF-1.4\n");
    let mut offsets = Vec::new();
    for (i, object) in objects.iter().enumerate() {
        offsets.push(out.len());
        out.push_str(&format!("{} 0 obj\n{object}\nendobj\n", i + 1));
    }
    let xref = out.len();
    out.push_str(&format!("xref\n0 {}\n0000000000 65535 f \n", objects.len() + 1));
    for offset in offsets {
        out.push_str(&format!("{offset:010} 00000 n \n"));
    }
    out.push_str(&format!(
        "trailer\n<< /Size {} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n",
        objects.len() + 1
    ));
    out.into_bytes()
}

/// A mono 16-bit PCM WAV of `seconds` of silence at `rate` Hz.
pub fn wav(seconds: u32, rate: u32) -> Vec<u8> {
    let data = seconds * rate * 2;
    let mut out = b"RIFF".to_vec();
    out.extend_from_slice(&(36 + data).to_le_bytes());
    out.extend_from_slice(b"WAVEfmt ");
    out.extend_from_slice(&16u32.to_le_bytes());
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&rate.to_le_bytes());
    out.extend_from_slice(&(rate * 2).to_le_bytes());
    out.extend_from_slice(&2u16.to_le_bytes());
    out.extend_from_slice(&16u16.to_le_bytes());
    out.extend_from_slice(b"data");
    out.extend_from_slice(&data.to_le_bytes());
    out.resize(out.len() + data as usize, 0);
    out
}

/// An OpenAI chat `image_url` part carrying `bytes` as a `data:` URL.
pub fn image_url_part(mime: &str, bytes: &[u8], detail: Option<&str>) -> String {
    let detail = detail.map(|d| format!(",\"detail\":\"{d}\"")).unwrap_or_default();
    format!(
        "{{\"type\":\"image_url\",\"image_url\":{{\"url\":\"data:{mime};base64,{}\"{detail}}}}}",
        base64(bytes)
    )
}

/// An Anthropic `image` block with a base64 source.
pub fn anthropic_image_part(mime: &str, bytes: &[u8]) -> String {
    format!(
        "{{\"type\":\"image\",\"source\":{{\"type\":\"base64\",\"media_type\":\"{mime}\",\"data\":\"{}\"}}}}",
        base64(bytes)
    )
}
