use super::samples::{anthropic_image_part, base64, gif, image_url_part, jpeg, pdf, png, wav, webp};
use super::*;
use crate::RString;

fn opaque(json: String) -> Part {
    Part::Opaque {
        json: RString::from(json),
    }
}

fn fixed(part: &Part, rules: &MediaRules) -> u64 {
    let cost = part.cost(rules);
    assert!(cost.texts.is_empty(), "no text to tokenize: {:?}", cost.texts);
    cost.tokens
}

#[test]
fn openai_tiles_match_the_published_examples_on_real_images() {
    // 1024×1024 high detail: 768×768, four tiles: 85 + 4 × 170 = 765.
    let big = opaque(image_url_part("image/png", &png(1024, 1024), Some("high")));
    assert_eq!(big.kind(), PartKind::Image);
    assert_eq!(fixed(&big, &MediaRules::OPENAI), 765);
    // 2048×4096: fit 1024×2048, shortest side 768 → 768×1536, 6 tiles: 1105.
    let tall = opaque(image_url_part("image/png", &png(2048, 4096), None));
    assert_eq!(fixed(&tall, &MediaRules::OPENAI), 1105);
    // Low detail: 85 whatever the size.
    let low = opaque(image_url_part("image/png", &png(1024, 1024), Some("low")));
    assert_eq!(fixed(&low, &MediaRules::OPENAI), 85);
    // A small image is not scaled up: 300×200 is one tile.
    let small = opaque(image_url_part(
        "image/jpeg",
        &jpeg(300, 200, 20_000),
        Some("auto"),
    ));
    assert_eq!(fixed(&small, &MediaRules::OPENAI), 255);
}

#[test]
fn anthropic_area_matches_the_published_example() {
    // 1000×1000 → 1000 × 1000 / 750 ≈ 1,334.
    let part = opaque(anthropic_image_part("image/png", &png(1000, 1000)));
    assert_eq!(part.kind(), PartKind::Image);
    assert_eq!(fixed(&part, &MediaRules::ANTHROPIC), 1334);
    // A long side over 1568 is scaled first: 3136×1568 → 1568×784 → 1,640.
    let wide = opaque(anthropic_image_part("image/webp", &webp(3136, 1568)));
    assert_eq!(fixed(&wide, &MediaRules::ANTHROPIC), 1640);
}

#[test]
fn every_format_gives_its_size_from_the_header() {
    for (mime, bytes, format, w, h) in [
        ("image/png", png(640, 480), ImageFormat::Png, 640, 480),
        (
            "image/jpeg",
            jpeg(1280, 800, 30_000),
            ImageFormat::Jpeg,
            1280,
            800,
        ),
        ("image/gif", gif(320, 240), ImageFormat::Gif, 320, 240),
        ("image/webp", webp(1920, 1080), ImageFormat::Webp, 1920, 1080),
    ] {
        let part = opaque(image_url_part(mime, &bytes, None));
        let info = part.image_info().unwrap_or_else(|| panic!("{mime}: no size"));
        assert_eq!((info.format, info.width, info.height), (format, w, h), "{mime}");
    }
}

#[test]
fn images_of_unknown_size_cost_the_configured_amount() {
    let url = opaque(r#"{"type":"image_url","image_url":{"url":"https://example.com/a.png"}}"#.into());
    assert_eq!(
        fixed(&url, &MediaRules::OPENAI),
        MediaRules::OPENAI.image_tokens_unknown
    );
    let source_url =
        opaque(r#"{"type":"image","source":{"type":"url","url":"https://example.com/a.png"}}"#.into());
    assert_eq!(fixed(&source_url, &MediaRules::ANTHROPIC), 1600);
    let garbage = opaque(format!(
        r#"{{"type":"input_image","image_url":"data:image/png;base64,{}"}}"#,
        "QUFB".repeat(3000)
    ));
    assert_eq!(fixed(&garbage, &MediaRules::OPENAI), 765);
}

#[test]
fn pdf_pages_times_the_rate_and_text_documents_by_their_text() {
    let doc = opaque(format!(
        r#"{{"type":"document","source":{{"type":"base64","media_type":"application/pdf","data":"{}"}}}}"#,
        base64(&pdf(7))
    ));
    assert_eq!(doc.kind(), PartKind::Document);
    assert_eq!(fixed(&doc, &MediaRules::ANTHROPIC), 7 * 2000);
    let file = opaque(format!(
        r#"{{"type":"file","file":{{"filename":"a.pdf","file_data":"data:application/pdf;base64,{}"}}}}"#,
        base64(&pdf(3))
    ));
    assert_eq!(fixed(&file, &MediaRules::OPENAI), 3 * 1500);
    let input_file = opaque(format!(
        r#"{{"type":"input_file","filename":"a.pdf","file_data":"data:application/pdf;base64,{}"}}"#,
        base64(&pdf(120))
    ));
    assert_eq!(fixed(&input_file, &MediaRules::OPENAI), 120 * 1500);
    let text = opaque(r#"{"type":"document","source":{"type":"text","media_type":"text/plain","data":"a \"quoted\" text"}}"#.into());
    assert_eq!(
        text.cost(&MediaRules::ANTHROPIC).texts,
        vec![Cow::Borrowed("a \"quoted\" text")]
    );
}

#[test]
fn wav_audio_is_counted_by_its_duration() {
    let part = opaque(format!(
        r#"{{"type":"input_audio","input_audio":{{"data":"{}","format":"wav"}}}}"#,
        base64(&wav(3, 8000))
    ));
    assert_eq!(part.kind(), PartKind::Audio);
    assert_eq!(fixed(&part, &MediaRules::OPENAI), 30);
    // A model's own rate; a configured `audio_tokens_unknown` does not apply to a WAV.
    let rated = MediaRules {
        audio_tokens_per_second: 25,
        audio_tokens_unknown: Some(7),
        ..MediaRules::OPENAI
    };
    assert_eq!(fixed(&part, &rated), 75);
}

#[test]
fn audio_without_a_duration_costs_the_configured_default_or_its_size_estimate() {
    // 32,000 bytes of MP3: two seconds at 128 kbit/s.
    let mp3 = opaque(format!(
        r#"{{"type":"input_audio","input_audio":{{"data":"{}","format":"mp3"}}}}"#,
        base64(&vec![0x55; 32_000])
    ));
    assert_eq!(fixed(&mp3, &MediaRules::OPENAI), 20);
    let rated = MediaRules {
        audio_tokens_per_second: 25,
        ..MediaRules::OPENAI
    };
    assert_eq!(fixed(&mp3, &rated), 50);
    let configured = MediaRules {
        audio_tokens_unknown: Some(400),
        ..rated
    };
    assert_eq!(fixed(&mp3, &configured), 400);
}

#[test]
fn reasoning_text_is_tokenized_and_encrypted_reasoning_estimated() {
    let thinking =
        opaque(r#"{"type":"thinking","thinking":"Let me think.","signature":"EqQBCkYIBx"}"#.into());
    assert_eq!(thinking.kind(), PartKind::Reasoning);
    let cost = thinking.cost(&MediaRules::ANTHROPIC);
    // The text by the tokenizer, the signature (10 bytes) as bytes / 4.
    assert_eq!(
        (cost.tokens, cost.texts),
        (3, vec![Cow::Borrowed("Let me think.")])
    );
    let redacted = opaque(format!(
        r#"{{"type":"redacted_thinking","data":"{}"}}"#,
        "x".repeat(400)
    ));
    assert_eq!(fixed(&redacted, &MediaRules::ANTHROPIC), 100);
    let item = opaque(format!(
        r#"{{"type":"reasoning","id":"rs_1","summary":[{{"type":"summary_text","text":"Checked the file."}}],"encrypted_content":"{}"}}"#,
        "y".repeat(8000)
    ));
    let cost = item.cost(&MediaRules::OPENAI);
    assert_eq!(
        (cost.tokens, cost.texts),
        (2000, vec![Cow::Borrowed("Checked the file.")])
    );
}

#[test]
fn other_parts_are_their_json_text_and_base64_never_a_text() {
    let other = opaque(r#"{"type":"custom","x":1}"#.into());
    assert_eq!(other.kind(), PartKind::Other);
    assert_eq!(
        other.cost(&MediaRules::OPENAI).texts,
        vec![Cow::Borrowed(r#"{"type":"custom","x":1}"#)]
    );
    let image = opaque(image_url_part("image/png", &png(64, 64), None));
    assert!(image.cost(&MediaRules::OPENAI).texts.is_empty());
}

#[test]
fn reasoning_members_are_read_from_extra() {
    let mut message = crate::Message::new(crate::Role::Assistant, crate::Content::Text("ok".into()));
    message.extra.push(crate::Member {
        key: "reasoning_content".into(),
        json: r#""step one\nstep two""#.into(),
    });
    message.extra.push(crate::Member {
        key: "reasoning".into(),
        json: r#"{"x":1}"#.into(),
    });
    let history = [message];
    let texts: Vec<String> = history[0].reasoning_texts().collect();
    assert_eq!(texts, vec!["step one\nstep two".to_string()]);
}
