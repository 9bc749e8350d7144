//! `token_budget`: keeps the history within a token budget (docs/plugins.md#token_budget).
//!
//! Keeps the pinned messages (leading system messages and, by default, the first user
//! message) and the newest whole units whose tokens fit the budget, by the shared rules of
//! docs/plugins.md#shared-trimming-rules ([`history_trim`]): units are never split, the kept suffix starts with a user
//! message unless the pinned task precedes it, the result is never empty (an `over-budget`
//! event says when that meant keeping more than fits) and a history that fits comes back
//! unchanged. With `target_tokens` the cut is quantized so it stays put for many turns and
//! the provider's prompt cache survives.
//!
//! Tokens are counted by the host (`ctx.tokens()`), which remembers each message's count on
//! the message: a long conversation is not re-tokenized every turn.

use history_trim::{Pins, Window};
use plugin_api::{
    ConfigError, ConfigTable, Context, Event, EventKind, HistoryPlugin, LoadContext, Message, ModelInfo,
    Output, RArc, Tokenizer,
};

/// `reserve_tokens` when the config does not set it (docs/plugins.md#token_budget).
pub const DEFAULT_RESERVE_TOKENS: u64 = 4096;
/// `per_message_tokens` when the config does not set it (docs/plugins.md#token_budget).
pub use plugin_api::DEFAULT_PER_MESSAGE_TOKENS;

pub struct TokenBudget {
    pins: Pins,
    /// A fixed budget; otherwise the model's `context_tokens − reserve_tokens`.
    max_tokens: Option<u64>,
    reserve_tokens: u64,
    per_message_tokens: u64,
    /// A fixed tokenizer; otherwise the model's.
    tokenizer: Option<Tokenizer>,
    target_tokens: Option<u64>,
}

impl TokenBudget {
    /// The budget B for `model`. May be ≤ 0 for a model only seen at run time (every
    /// listed model was checked at load); the shared rules then keep only what the
    /// never-empty rule keeps.
    pub fn budget(&self, model: &ModelInfo) -> i64 {
        match self.max_tokens {
            Some(max) => to_i64(max),
            None => to_i64(model.context_tokens).saturating_sub(to_i64(self.reserve_tokens)),
        }
    }

    fn tokenizer_for(&self, model: &ModelInfo) -> Tokenizer {
        self.tokenizer.unwrap_or(model.tokenizer)
    }

    fn trim(&self, history: &[RArc<Message>], ctx: &Context) -> Output {
        let tokenizer = self.tokenizer_for(&ctx.model);
        let costs: Vec<u64> = history
            .iter()
            .map(|m| ctx.tokens().message(tokenizer, m, self.per_message_tokens))
            .collect();
        let budget = self.budget(&ctx.model);
        let window = Window {
            budget,
            // history_trim ignores a target that is not below the budget (plain cut), as
            // docs/plugins.md#token_budget asks where that only shows at run time.
            target: self.target_tokens,
            count_pinned: true,
        };
        let plan = history_trim::plan(history, &costs, self.pins, window);
        let kept_tokens: Option<u64> = plan.as_ref().map(|plan| {
            plan.keep
                .iter()
                .zip(&costs)
                .filter(|(keep, _)| **keep)
                .map(|(_, cost)| cost)
                .sum()
        });
        let mut output = history_trim::apply(history, plan, ctx, "outside the token budget");
        // Say what each removal saved and, for over-budget, by how much the result is
        // over: an operator reading the events needs the numbers, not just the fact.
        for event in output.events.iter_mut() {
            match event.kind {
                EventKind::MessageRemoved => {
                    if let Some(index) = event.index.into_option() {
                        let saved = costs.get(index as usize).copied().unwrap_or(0);
                        *event = event.clone().saving(to_i64(saved));
                    }
                }
                EventKind::OverBudget => {
                    let kept = kept_tokens.unwrap_or(0);
                    *event = Event::new(
                        EventKind::OverBudget,
                        ctx.turn,
                        format!(
                            "kept {kept} tokens ({} tokenizer) over a budget of {budget}: no suffix of whole units that fits starts validly, so the newest valid part was kept",
                            tokenizer.as_str()
                        ),
                    );
                }
                _ => {}
            }
        }
        output
    }
}

fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl HistoryPlugin for TokenBudget {
    const NAME: &'static str = "token_budget";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const SUMMARY: &'static str =
        "token budget: pinned messages plus the newest whole units whose tokens fit the budget";
    const CONFIG_KEYS: &'static [(&'static str, &'static str)] = &[
        (
            "max_tokens",
            "the budget in tokens (default: the model's context_tokens − reserve_tokens)",
        ),
        (
            "reserve_tokens",
            "tokens left for the reply when the budget comes from the model (default 4096)",
        ),
        (
            "per_message_tokens",
            "tokens added per message on top of its items (default 3)",
        ),
        (
            "tokenizer",
            "o200k_base | cl100k_base | chars4 (default: the model's)",
        ),
        ("pin_system", "keep the leading system messages (default true)"),
        (
            "pin_first_user",
            "keep the first user message, the task (default true)",
        ),
        (
            "target_tokens",
            "cache-stable cuts: trim down to about this many tokens at a time (below the budget)",
        ),
    ];

    fn new(load: &LoadContext) -> Result<Self, ConfigError> {
        let mut config = ConfigTable::parse(&load.config_json)?;
        // A zero budget could keep nothing that fits: refuse it where it is known.
        let max_tokens = config.positive("max_tokens")?;
        let reserve_tokens = config.u64("reserve_tokens")?;
        let per_message_tokens = config
            .u64("per_message_tokens")?
            .unwrap_or(DEFAULT_PER_MESSAGE_TOKENS);
        let tokenizer = config.one_of("tokenizer", &Tokenizer::ALL.map(|t| (t.as_str(), t)))?;
        let pins = Pins {
            system: config.bool("pin_system")?.unwrap_or(true),
            first_user: config.bool("pin_first_user")?.unwrap_or(true),
        };
        let target_tokens = config.u64("target_tokens")?;

        if max_tokens.is_some() && reserve_tokens.is_some() {
            // docs/plugins.md#token_budget: max_tokens wins. Not an error, but the operator should know the
            // reserve does nothing.
            load.log()
                .warn("token_budget: reserve_tokens is ignored because max_tokens is set");
        }
        let plugin = TokenBudget {
            pins,
            max_tokens,
            reserve_tokens: reserve_tokens.unwrap_or(DEFAULT_RESERVE_TOKENS),
            per_message_tokens,
            tokenizer,
            target_tokens,
        };

        // Values checkable only against a model are checked against every listed one
        // (docs/configuration.md).
        match max_tokens {
            Some(max) => {
                if let Some(target) = target_tokens.filter(|&t| t >= max) {
                    return Err(config.invalid(
                        "target_tokens",
                        format!("{target} is not below max_tokens ({max})"),
                    ));
                }
            }
            None => {
                for model in load.models.iter() {
                    let budget = plugin.budget(model);
                    if budget <= 0 {
                        return Err(config.invalid(
                            "reserve_tokens",
                            format!(
                                "{} leaves no budget for model \"{}\" (context_tokens {})",
                                plugin.reserve_tokens, model.name, model.context_tokens
                            ),
                        ));
                    }
                    if let Some(target) = target_tokens.filter(|&t| to_i64(t) >= budget) {
                        return Err(config.invalid(
                            "target_tokens",
                            format!(
                                "{target} is not below the budget of model \"{}\" ({budget} = context_tokens {} − reserve_tokens {})",
                                model.name, model.context_tokens, plugin.reserve_tokens
                            ),
                        ));
                    }
                }
            }
        }
        config.finish()?;
        Ok(plugin)
    }

    fn process(&self, history: &[RArc<Message>], ctx: &Context) -> Result<Output, String> {
        Ok(self.trim(history, ctx))
    }

    /// The new model's budget (and tokenizer, unless configured) applies at once.
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

plugin_api::export_plugin!(TokenBudget);

#[cfg(test)]
mod tests {
    use super::*;
    use history_wire::chat::history_from_str;
    use plugin_testing::{context, load_context};

    fn plugin(config: &str) -> Result<TokenBudget, ConfigError> {
        TokenBudget::new(&load_context(config))
    }

    #[test]
    fn unknown_keys_and_bad_values_are_named() {
        let err = plugin(r#"{"max_token": 10}"#).err().unwrap();
        assert_eq!(err.key.as_str(), "max_token");
        let err = plugin(r#"{"tokenizer": "gpt2"}"#).err().unwrap();
        assert_eq!(err.key.as_str(), "tokenizer");
        assert!(err.message.contains("chars4"), "{err}");
        let err = plugin(r#"{"max_tokens": 0}"#).err().unwrap();
        assert_eq!(err.key.as_str(), "max_tokens");
        let err = plugin(r#"{"pin_system": "yes"}"#).err().unwrap();
        assert_eq!(err.key.as_str(), "pin_system");
    }

    #[test]
    fn model_dependent_values_are_checked_against_every_model() {
        // The test model has 128,000 context tokens.
        let err = plugin(r#"{"reserve_tokens": 128000}"#).err().unwrap();
        assert_eq!(err.key.as_str(), "reserve_tokens");
        assert!(err.message.contains("\"test\""), "{err}");
        let err = plugin(r#"{"target_tokens": 123904}"#).err().unwrap();
        assert_eq!(err.key.as_str(), "target_tokens");
        assert!(plugin(r#"{"target_tokens": 123903}"#).is_ok());
        let err = plugin(r#"{"max_tokens": 100, "target_tokens": 100}"#)
            .err()
            .unwrap();
        assert_eq!(err.key.as_str(), "target_tokens");
    }

    #[test]
    fn budget_is_max_tokens_or_context_minus_reserve() {
        let model = plugin_testing::model(10);
        assert_eq!(plugin("{}").unwrap().budget(&model), 128_000 - 4096);
        assert_eq!(
            plugin(r#"{"reserve_tokens": 1000}"#).unwrap().budget(&model),
            127_000
        );
        assert_eq!(plugin(r#"{"max_tokens": 77}"#).unwrap().budget(&model), 77);
        // max_tokens wins over a reserve (docs/plugins.md#token_budget: "max_tokens if set").
        let both = plugin(r#"{"max_tokens": 77, "reserve_tokens": 5}"#).unwrap();
        assert_eq!(both.budget(&model), 77);
    }

    #[test]
    fn counts_per_message_overhead_and_items() {
        // chars4: "abcd" = 1, "abcde" = 2; 3 per message.
        let history = history_from_str(
            r#"[{"role":"user","content":"abcd"},{"role":"assistant","content":"abcde"},
                {"role":"user","content":"abcd"},{"role":"assistant","content":"abcd"}]"#,
        )
        .unwrap();
        // Total = 4 + 5 + 4 + 4 = 17: fits 17, not 16.
        let fits = plugin(r#"{"max_tokens": 17, "pin_first_user": false}"#).unwrap();
        let out = fits.process(&history, &context(10, 2)).unwrap();
        assert_eq!(out.history.len(), 4);
        assert!(out.events.is_empty());
        let cut = plugin(r#"{"max_tokens": 16, "pin_first_user": false}"#).unwrap();
        let out = cut.process(&history, &context(10, 2)).unwrap();
        assert_eq!(out.history.len(), 2);
        assert_eq!(out.events.len(), 2);
        assert_eq!(out.events[0].tokens_saved.into_option(), Some(4));
        assert_eq!(out.events[1].tokens_saved.into_option(), Some(5));
    }
}
