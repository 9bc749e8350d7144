//! `[models]` (docs/configuration.md#models): each `[models.NAME]` table as written, what a
//! name the file does not list gets (`unknown`), and what the model's non-text parts cost
//! (`plugin_api::parts::MediaRules`, docs/configuration.md#models).

use plugin_api::echo;
use plugin_api::parts::{ImageTokens, MediaRules};
use plugin_api::Tokenizer;
use toml_edit::Table;

use super::Reader;
use crate::ConfigError;

/// What a model name the file does not list gets (`[models] unknown`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UnknownModels {
    /// Refused, naming the listed models: a typo must not silently get another window
    /// and tokenizer.
    #[default]
    Refuse,
    /// `[models.default]`'s settings (with a warning where one can be given).
    Default,
}

/// A `[models.NAME]` table as written (keys it lacks are `None`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelTable {
    pub max_context: Option<u64>,
    pub context_tokens: Option<u64>,
    pub tokenizer: Option<Tokenizer>,
    /// `image_tokens` (docs/configuration.md#models).
    pub image_tokens: Option<ImageTokens>,
    pub image_tokens_unknown: Option<u64>,
    pub document_tokens_per_page: Option<u64>,
    pub audio_tokens_per_second: Option<u64>,
    pub audio_tokens_unknown: Option<u64>,
}

/// The rules a call on model `name` counts images and documents by, from `models` (a
/// configuration's `[models.*]`, or the copy a chain keeps): each key from the listed
/// table, else from `[models.default]`, else the defaults of the name's provider family.
pub fn media_rules(models: &[(String, ModelTable)], name: &str) -> MediaRules {
    let table = |n: &str| models.iter().find(|(m, _)| m == n).map(|(_, t)| t);
    let (listed, fallback) = (table(name), table("default"));
    let family = MediaRules::for_model(name);
    let pick = |f: fn(&ModelTable) -> Option<u64>| listed.and_then(f).or_else(|| fallback.and_then(f));
    MediaRules {
        image_tokens: listed
            .and_then(|t| t.image_tokens)
            .or_else(|| fallback.and_then(|t| t.image_tokens))
            .unwrap_or(family.image_tokens),
        image_tokens_unknown: pick(|t| t.image_tokens_unknown).unwrap_or(family.image_tokens_unknown),
        document_tokens_per_page: pick(|t| t.document_tokens_per_page)
            .unwrap_or(family.document_tokens_per_page),
        audio_tokens_per_second: pick(|t| t.audio_tokens_per_second)
            .unwrap_or(family.audio_tokens_per_second),
        audio_tokens_unknown: pick(|t| t.audio_tokens_unknown).or(family.audio_tokens_unknown),
    }
}

const KEYS: &[&str] = &[
    "max_context",
    "context_tokens",
    "tokenizer",
    "image_tokens",
    "image_tokens_unknown",
    "document_tokens_per_page",
    "audio_tokens_per_second",
    "audio_tokens_unknown",
];

/// Reads and checks `[models]`: its tables in file order, and `unknown`.
pub(super) fn read(
    reader: &Reader<'_>,
    table: &Table,
) -> Result<(Vec<(String, ModelTable)>, UnknownModels), ConfigError> {
    let mut models = Vec::new();
    let mut unknown_models = UnknownModels::default();
    for (name, item) in table.iter() {
        if name == "unknown" && !item.is_table() {
            unknown_models = match reader.string(table, "unknown", "[models]")? {
                Some("refuse") => UnknownModels::Refuse,
                Some("default") => UnknownModels::Default,
                other => {
                    return Err(reader.key_error(
                        table,
                        "unknown",
                        format!(
                            "`unknown` in [models] must be \"refuse\" or \"default\", found {}",
                            echo::quoted(other.unwrap_or(""))
                        ),
                    ))
                }
            };
            continue;
        }
        let place = format!("[models.{}]", echo::bare(name));
        let Some(model) = reader.table(table, name, "[models]")? else {
            continue;
        };
        models.push((name.to_string(), model_table(reader, model, &place)?));
    }
    Ok((models, unknown_models))
}

fn model_table(reader: &Reader<'_>, model: &Table, place: &str) -> Result<ModelTable, ConfigError> {
    reader.refuse_unknown(model, place, KEYS)?;
    let tokenizer = match reader.string(model, "tokenizer", place)? {
        None => None,
        Some(t) => Some(Tokenizer::parse(t).ok_or_else(|| {
            reader.key_error(
                model,
                "tokenizer",
                format!(
                    "`tokenizer` in {place} must be one of o200k_base, cl100k_base, chars4, found {}",
                    echo::quoted(t)
                ),
            )
        })?),
    };
    let image_tokens = match reader.string(model, "image_tokens", place)? {
        None => None,
        Some(rule) => Some(ImageTokens::parse(rule).ok_or_else(|| {
            reader.key_error(
                model,
                "image_tokens",
                format!(
                    "`image_tokens` in {place} must be \"openai-tiles\" or \"anthropic-area\", found {}",
                    echo::quoted(rule)
                ),
            )
        })?),
    };
    Ok(ModelTable {
        max_context: reader.integer(model, "max_context", place, 1)?,
        context_tokens: reader.integer(model, "context_tokens", place, 1)?,
        tokenizer,
        image_tokens,
        image_tokens_unknown: reader.integer(model, "image_tokens_unknown", place, 0)?,
        document_tokens_per_page: reader.integer(model, "document_tokens_per_page", place, 0)?,
        audio_tokens_per_second: reader.integer(model, "audio_tokens_per_second", place, 0)?,
        audio_tokens_unknown: reader.integer(model, "audio_tokens_unknown", place, 0)?,
    })
}
