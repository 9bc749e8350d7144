//! `media_filter`: old images and documents out, text kept (docs/plugins.md#media_filter).
//!
//! A computer-use agent sends a screenshot every step; the model needs the last few. The
//! newest `keep_images` images (and `keep_documents` documents) stay, wherever they are
//! (a user message, a tool result); each older one becomes a short text part saying what
//! it was, in its place, and the message keeps its original content for expansion. The
//! removal is quantized (`min_removal_threshold`), like Anthropic's computer-use reference
//! loop, so the sent prefix changes once per chunk of images, not every turn.
//!
//! A plugin of its own rather than a key of `tool_result_filter`: images sit in user
//! messages as often as in tool results, and this plugin never touches a text.

mod reasoning;

use plugin_api::parts::PartKind;
use plugin_api::{
    ConfigError, ConfigTable, Content, Context, Event, EventKind, HistoryPlugin, LoadContext, Message,
    Output, Part, RArc, ROption,
};

pub struct MediaFilter {
    keep_images: Option<usize>,
    keep_documents: Option<usize>,
    min_removal_threshold: usize,
    preserve_original: bool,
    /// `keep_thinking_turns`: `None` keeps all reasoning (`all`, or the key absent).
    keep_thinking_turns: Option<usize>,
}

/// Where a media part sits: message index, part index.
type At = (usize, usize);

impl MediaFilter {
    /// The parts of `kind` to replace: all but the newest `keep`, their number rounded down
    /// to a multiple of `min_removal_threshold`, oldest first.
    fn to_replace(&self, history: &[RArc<Message>], kind: PartKind, keep: usize) -> Vec<At> {
        let mut found: Vec<At> = Vec::new();
        for (m, message) in history.iter().enumerate() {
            // An expanded message was asked for on purpose: its media stay, and count.
            let skip = message.is_expanded();
            if let Content::Parts(parts) = &message.content {
                for (p, part) in parts.iter().enumerate() {
                    if part.kind() == kind && !skip {
                        found.push((m, p));
                    }
                }
            }
        }
        let mut remove = found.len().saturating_sub(keep);
        remove -= remove % self.min_removal_threshold.max(1);
        found.truncate(remove);
        found
    }

    /// The placeholder of one part: `[image omitted: 1280×800 png, 1105 tokens]`.
    fn placeholder(&self, ctx: &Context, message: &Message, part: &Part) -> String {
        let mut alone = message.clone();
        alone.content = Content::Parts(vec![part.clone()].into());
        alone.tool_calls = Default::default();
        alone.extra = Default::default();
        let tokens = ctx.tokens().content(ctx.model.tokenizer, &alone);
        match (part.kind(), part.image_info()) {
            (PartKind::Image, Some(info)) => format!(
                "[image omitted: {}×{} {}, {tokens} tokens]",
                info.width,
                info.height,
                info.format.as_str()
            ),
            (PartKind::Image, None) => format!("[image omitted: {tokens} tokens]"),
            _ => format!(
                "[document omitted: {}, {tokens} tokens]",
                part.type_name().unwrap_or("document")
            ),
        }
    }
}

impl HistoryPlugin for MediaFilter {
    const NAME: &'static str = "media_filter";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const SUMMARY: &'static str =
        "keeps the newest images and documents; older ones become a text placeholder, the text kept";
    const CONFIG_KEYS: &'static [(&'static str, &'static str)] = &[
        ("keep_images", "the newest N images stay (default: all)"),
        ("keep_documents", "the newest N documents stay (default: all)"),
        (
            "min_removal_threshold",
            "remove in chunks of this many, so the sent prefix stays cache-stable (default 1)",
        ),
        (
            "preserve_original",
            "keep original_content and can_expand for expansion (default true)",
        ),
        (
            "keep_thinking_turns",
            "the newest N assistant turns keep their reasoning, or \"all\" (default all); never the open tool loop's",
        ),
    ];

    fn new(load: &LoadContext) -> Result<Self, ConfigError> {
        let mut config = ConfigTable::parse(&load.config_json)?;
        let size = |v: Option<u64>| v.map(|n| usize::try_from(n).unwrap_or(usize::MAX));
        let keep_images = size(config.u64("keep_images")?);
        let keep_documents = size(config.u64("keep_documents")?);
        let min_removal_threshold = size(config.positive("min_removal_threshold")?).unwrap_or(1);
        let preserve_original = config.bool("preserve_original")?.unwrap_or(true);
        let keep_thinking_turns = config
            .u64_or("keep_thinking_turns", "all")?
            .flatten()
            .map(|n| usize::try_from(n).unwrap_or(usize::MAX));
        config.finish()?;
        Ok(MediaFilter {
            keep_images,
            keep_documents,
            min_removal_threshold,
            preserve_original,
            keep_thinking_turns,
        })
    }

    fn process(&self, history: &[RArc<Message>], ctx: &Context) -> Result<Output, String> {
        let mut replace: Vec<At> = Vec::new();
        if let Some(keep) = self.keep_images {
            replace.extend(self.to_replace(history, PartKind::Image, keep));
        }
        if let Some(keep) = self.keep_documents {
            replace.extend(self.to_replace(history, PartKind::Document, keep));
        }
        let mut out: Vec<RArc<Message>> = history.to_vec();
        let mut events = Vec::new();
        if let Some(keep) = self.keep_thinking_turns {
            reasoning::clear(&mut out, &mut events, ctx, keep, self.preserve_original);
        }
        if replace.is_empty() {
            return Ok(Output::new(out, events));
        }
        replace.sort_unstable();
        for chunk in replace.chunk_by(|a, b| a.0 == b.0) {
            let index = chunk[0].0;
            let message = &history[index];
            let Content::Parts(parts) = &message.content else {
                continue;
            };
            let mut copy = (**message).clone();
            let mut new_parts = parts.clone();
            for &(_, p) in chunk {
                new_parts[p] = Part::text(self.placeholder(ctx, message, &parts[p]));
            }
            copy.content = Content::Parts(new_parts);
            let before = ctx.tokens().content(ctx.model.tokenizer, message) as i64;
            let saved = before - ctx.tokens().content(ctx.model.tokenizer, &copy) as i64;
            let meta = copy.meta_mut();
            meta.omitted = ROption::RSome(true);
            meta.tokens_saved = ROption::RSome(saved);
            meta.retention_policy = ROption::RNone;
            if self.preserve_original {
                meta.can_expand = ROption::RSome(true);
                if meta.original_content.is_none() {
                    meta.original_content = ROption::RSome(message.content.clone());
                }
            }
            events.push(
                Event::new(
                    EventKind::MessageOmitted,
                    ctx.turn,
                    format!(
                        "{} old image or document part(s) replaced with a text placeholder",
                        chunk.len()
                    ),
                )
                .at(index, message)
                .saving(saved),
            );
            out[index] = RArc::new(copy);
        }
        ctx.log().info(&format!(
            "media_filter: {} old image or document part(s) replaced",
            replace.len()
        ));
        Ok(Output::new(out, events))
    }
}

plugin_api::export_plugin!(MediaFilter);

#[cfg(test)]
mod tests {
    use super::*;
    use plugin_api::parts::samples::{image_url_part, png};
    use plugin_testing as testing;

    fn conversation(images: usize) -> String {
        let steps: Vec<String> = (0..images)
            .map(|i| {
                format!(
                    r#"{{"role":"user","content":[{{"type":"text","text":"step {i}"}},{}]}},{{"role":"assistant","content":"ok {i}"}}"#,
                    image_url_part("image/png", &png(1280, 800), None)
                )
            })
            .collect();
        format!("[{}]", steps.join(","))
    }

    #[test]
    fn the_newest_images_stay_older_ones_become_placeholders_in_chunks() {
        let history = testing::history(&conversation(7));
        let plugin = MediaFilter::new(&testing::load_context(
            r#"{"keep_images":2,"min_removal_threshold":2}"#,
        ))
        .unwrap();
        let ctx = testing::settings().context();
        let output = plugin.process(&history, &ctx).unwrap();
        testing::check(&history, &output.history).unwrap();
        // 7 images, keep 2: 5 to remove, rounded down to 4.
        let kinds: Vec<bool> = output
            .history
            .iter()
            .filter(|m| m.role == plugin_api::Role::User)
            .map(|m| m.content.to_parts().iter().any(|p| p.kind() == PartKind::Image))
            .collect();
        assert_eq!(kinds, [false, false, false, false, true, true, true]);
        let first = &output.history[0];
        let text = first.content.text();
        assert!(text.starts_with("step 0[image omitted: 1280×800 png, "), "{text}");
        assert!(first.meta().unwrap().omitted());
        assert_eq!(first.restored_copy().unwrap().content, history[0].content);
        assert_eq!(output.events.len(), 4);
        // Texts untouched, assistant messages shared.
        assert!(std::ptr::eq(&*output.history[1], &*history[1]));
        // Byte-stable: the next turn gives the same bytes for what was replaced.
        let again = plugin.process(&output.history, &ctx).unwrap();
        assert_eq!(again.history[0].content, output.history[0].content);
    }

    #[test]
    fn bad_config_names_the_key() {
        let err = MediaFilter::new(&testing::load_context(r#"{"keep_images":-1}"#))
            .err()
            .unwrap();
        assert!(err.to_string().starts_with("keep_images:"), "{err}");
        let err = MediaFilter::new(&testing::load_context(r#"{"min_removal_threshold":0}"#))
            .err()
            .unwrap();
        assert!(err.to_string().starts_with("min_removal_threshold:"), "{err}");
    }
}
