//! `[models]` (docs/configuration.md#models): each `[models.NAME]` table as written, what a
//! name the file does not list gets (`unknown`), and what the model's non-text parts cost
//! ([`MediaRules`], docs/wire-format.md#parts).

use plugin_api::echo;
use plugin_api::Tokenizer;
use toml_edit::Table;

use super::Reader;
use crate::ConfigError;

/// `document_tokens_per_page` when neither the model's table nor `[models.default]` sets it.
pub const DEFAULT_DOCUMENT_TOKENS_PER_PAGE: u64 = 1500;

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

/// How an image's pixels become tokens (`image_tokens`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageRule {
    /// OpenAI's: low detail 85; else fit in 2048 × 2048, shortest side to 768, then
    /// 85 + 170 per 512-px tile.
    OpenAiTiles,
    /// Anthropic's: width × height / 750 after fitting 1568 px on the long side.
    AnthropicArea,
}

impl ImageRule {
    pub fn parse(name: &str) -> Option<ImageRule> {
        match name {
            "openai-tiles" => Some(ImageRule::OpenAiTiles),
            "anthropic-area" => Some(ImageRule::AnthropicArea),
            _ => None,
        }
    }
}

/// What a model's images, documents and audio cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MediaRules {
    /// `image_tokens`; `None`: by the part's wire form (Anthropic's blocks by area, OpenAI's
    /// and Responses' parts by tiles), the family that reads it.
    pub image: Option<ImageRule>,
    /// `image_tokens_unknown`: an image whose size cannot be read (a URL); `None`: the
    /// rule's largest usual image (765 by tiles, 1,600 by area).
    pub image_unknown: Option<u64>,
    /// `document_tokens_per_page`: a PDF page.
    pub document_per_page: u64,
}

impl Default for MediaRules {
    fn default() -> Self {
        MediaRules {
            image: None,
            image_unknown: None,
            document_per_page: DEFAULT_DOCUMENT_TOKENS_PER_PAGE,
        }
    }
}

/// A `[models.NAME]` table as written (keys it lacks are `None`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelTable {
    pub max_context: Option<u64>,
    pub context_tokens: Option<u64>,
    pub tokenizer: Option<Tokenizer>,
    pub image_tokens: Option<ImageRule>,
    pub image_tokens_unknown: Option<u64>,
    pub document_tokens_per_page: Option<u64>,
}

const KEYS: &[&str] = &[
    "max_context",
    "context_tokens",
    "tokenizer",
    "image_tokens",
    "image_tokens_unknown",
    "document_tokens_per_page",
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
        Some(rule) => Some(ImageRule::parse(rule).ok_or_else(|| {
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
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::Config;

    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(Path::new("/x/plugins-enabled.toml"), text.to_string())
    }

    #[test]
    fn media_rules_fall_back_key_by_key_and_bad_values_name_the_key() {
        let config = parse(
            "[models.default]\ndocument_tokens_per_page = 900\n[models.claude]\nimage_tokens = \"anthropic-area\"\nimage_tokens_unknown = 1200\n",
        )
        .unwrap();
        assert_eq!(
            config.media_rules("claude"),
            MediaRules {
                image: Some(ImageRule::AnthropicArea),
                image_unknown: Some(1200),
                document_per_page: 900,
            }
        );
        assert_eq!(
            config.media_rules("unlisted"),
            MediaRules {
                document_per_page: 900,
                ..MediaRules::default()
            }
        );
        let err = parse("[models.x]\nimage_tokens = \"tiles\"\n").unwrap_err();
        assert!(
            err.message
                .contains("`image_tokens` in [models.x] must be \"openai-tiles\" or \"anthropic-area\""),
            "{err}"
        );
        assert_eq!(err.line, Some(2));
    }
}
