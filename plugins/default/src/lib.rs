//! `default`: the sliding window (docs/plugins.md#default). Always first in the chain.
//!
//! Keeps the pinned messages and the newest whole units holding at most `effective_ctx`
//! messages, by the shared rules of docs/plugins.md#shared-trimming-rules ([`history_trim`]). With `target_messages`
//! the cut is quantized so it stays put for many turns (the provider's prompt cache
//! survives). A model switch applies the new window at once.

use history_trim::{Pins, Window};
use plugin_api::{
    ConfigError, ConfigTable, Context, HistoryPlugin, LoadContext, Message, ModelInfo, Output, RArc,
};

pub struct SlidingWindow {
    pins: Pins,
    target_messages: Option<u64>,
}

impl SlidingWindow {
    fn trim(&self, history: &[RArc<Message>], ctx: &Context) -> Output {
        let costs = vec![1; history.len()];
        let window = Window {
            budget: i64::try_from(ctx.effective_ctx).unwrap_or(i64::MAX),
            target: self.target_messages,
            count_pinned: false,
        };
        let plan = history_trim::plan(history, &costs, self.pins, window);
        history_trim::apply(history, plan, ctx, "outside the message window")
    }
}

impl HistoryPlugin for SlidingWindow {
    const NAME: &'static str = "default";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const SUMMARY: &'static str =
        "sliding window: pinned messages plus the newest whole units within effective_ctx messages";
    const CONFIG_KEYS: &'static [(&'static str, &'static str)] = &[
        ("pin_system", "keep the leading system messages (default true)"),
        (
            "pin_first_user",
            "keep the first user message, the task (default true)",
        ),
        (
            "target_messages",
            "cache-stable cuts: trim down to about this many messages at a time (below effective_ctx)",
        ),
    ];

    fn new(load: &LoadContext) -> Result<Self, ConfigError> {
        let mut config = ConfigTable::parse(&load.config_json)?;
        let pins = Pins {
            system: config.bool("pin_system")?.unwrap_or(true),
            first_user: config.bool("pin_first_user")?.unwrap_or(true),
        };
        let target_messages = config.u64("target_messages")?;
        if let Some(target) = target_messages {
            if let Some(model) = load.models.iter().find(|m| target >= m.effective_ctx) {
                return Err(config.invalid(
                    "target_messages",
                    format!(
                        "{target} is not below the window of model \"{}\" (effective_ctx {})",
                        model.name, model.effective_ctx
                    ),
                ));
            }
        }
        config.finish()?;
        Ok(SlidingWindow {
            pins,
            target_messages,
        })
    }

    fn process(&self, history: &[RArc<Message>], ctx: &Context) -> Result<Output, String> {
        Ok(self.trim(history, ctx))
    }

    fn on_model_switch(
        &self,
        history: &[RArc<Message>],
        ctx: &Context,
        _old: &ModelInfo,
        _new: &ModelInfo,
    ) -> Result<Output, String> {
        Ok(self.trim(history, ctx))
    }
}

plugin_api::export_plugin!(SlidingWindow);
