//! `agentctl`'s reports rendered: `history-list` (the configuration as the host reads
//! it), `plugins` and `check` (the engine's self-check). Each is a text rendering and a
//! JSON one (`--json`).

use std::fmt::Write;

use history_engine::selfcheck::{CheckReport, LibraryStatus};
use history_engine::{echo, plugin_stem, Config, DiscoveryError};
use serde_json::{json, Value};

/// `history-list`: the chain in order with each plugin's summary, the settings, the
/// models with their window, and the available plugins not in the chain; from the
/// libraries as `plugins` found them (`statuses`).
pub fn history_list(
    config: &Config,
    statuses: &Result<Vec<LibraryStatus>, DiscoveryError>,
) -> (String, Value) {
    // A library stands for the plugin its file is named for.
    let file_of = |name: &str| -> Option<&LibraryStatus> {
        statuses.as_ref().ok()?.iter().find(|s| {
            s.file
                .as_deref()
                .and_then(plugin_stem)
                .is_some_and(|stem| stem == name)
        })
    };
    let describe = |name: &str| -> (Option<String>, Option<String>) {
        match (statuses, file_of(name)) {
            (Err(err), _) => (None, Some(err.to_string())),
            (Ok(_), Some(status)) if status.available => (status.summary.clone(), None),
            (Ok(_), Some(status)) => (
                None,
                Some(format!(
                    "cannot be loaded: {}",
                    status.reason.as_deref().unwrap_or("unknown reason")
                )),
            ),
            (Ok(_), None) => (
                None,
                Some(format!("not available in {}", config.plugin_dir.display())),
            ),
        }
    };
    let mut text = String::new();
    let _ = writeln!(text, "config: {}", config.file.display());
    let _ = writeln!(text, "plugin_dir: {}", config.plugin_dir.display());
    let width = config
        .chain
        .iter()
        .chain(&config.view)
        .map(String::len)
        .max()
        .unwrap_or(0);
    let mut list = |title: &str, names: &[String]| {
        let _ = writeln!(text, "{title}");
        if names.is_empty() {
            let _ = writeln!(text, "  (none)");
        }
        let mut entries = Vec::new();
        for (position, name) in names.iter().enumerate() {
            let (summary, problem) = describe(name);
            let shown = match (&summary, &problem) {
                (Some(summary), _) => echo::text(summary),
                (None, Some(problem)) => format!("(!) {problem}"),
                (None, None) => String::new(),
            };
            let _ = writeln!(text, "  {position}  {name:<width$}  {shown}");
            entries.push(json!({
                "position": position,
                "name": name,
                "description": summary,
                "available": problem.is_none(),
                "problem": problem,
                "required": config.is_required(name),
                "isolated": config.is_isolated(name),
            }));
        }
        entries
    };
    let chain_json = list("chain:", &config.chain);
    let view_json = list(
        "view (run after the chain on what is sent; not kept):",
        &config.view,
    );
    let timeout = match config.session_idle_timeout_minutes {
        0 => "0 (never reap)".to_string(),
        m => m.to_string(),
    };
    let _ = writeln!(text, "agent_max_ctx: {}", config.agent_max_ctx);
    let _ = writeln!(text, "max_users: {}", config.max_users);
    let _ = writeln!(text, "session_idle_timeout_minutes: {timeout}");
    let _ = writeln!(text, "on_plugin_error: {}", config.on_plugin_error.as_str());
    let _ = writeln!(
        text,
        "required (a fault fails the turn even under skip): {}",
        if config.required.is_empty() {
            "(none)".to_string()
        } else {
            config.required.join(", ")
        }
    );
    let _ = writeln!(
        text,
        "isolated (run in a worker process): {}",
        if config.isolate.is_empty() {
            "(none)".to_string()
        } else {
            config.isolate.join(", ")
        }
    );
    let _ = writeln!(text, "models:");
    let mut models_json = Vec::new();
    let models = config.models_for_validation();
    let width = models.iter().map(|m| m.name.len()).max().unwrap_or(0);
    for model in &models {
        let listed = config
            .models
            .iter()
            .any(|(n, _)| n.as_str() == model.name.as_str());
        let _ = writeln!(
            text,
            "  {:<width$}  effective_ctx {:>4}  (max_context {}, context_tokens {}, tokenizer {}){}",
            echo::bare(&model.name),
            model.effective_ctx,
            model.max_context,
            model.context_tokens,
            model.tokenizer.as_str(),
            if listed {
                ""
            } else {
                "  [built-in default: what an unlisted model gets]"
            }
        );
        models_json.push(json!({
            "name": model.name.as_str(),
            "effective_ctx": model.effective_ctx,
            "max_context": model.max_context,
            "context_tokens": model.context_tokens,
            "tokenizer": model.tokenizer.as_str(),
            "listed": listed,
        }));
    }
    let mut available_json = Vec::new();
    match statuses {
        Ok(statuses) => {
            let others: Vec<&LibraryStatus> = statuses
                .iter()
                .filter(|status| status.available && config.place_of(&status.name).is_none())
                .collect();
            if others.is_empty() {
                let _ = writeln!(text, "available, not in the chain: none");
            } else {
                let _ = writeln!(text, "available, not in the chain:");
                let width = others.iter().map(|l| l.name.len()).max().unwrap_or(0);
                for library in others {
                    let summary = echo::text(library.summary.as_deref().unwrap_or(""));
                    let _ = writeln!(text, "  {:<width$}  {summary}", library.name);
                    available_json.push(json!({
                        "name": library.name,
                        "version": library.version,
                        "description": summary,
                    }));
                }
            }
        }
        Err(err) => {
            let _ = writeln!(text, "available, not in the chain: unknown ({err})");
        }
    }
    let json = json!({
        "config": config.file.display().to_string(),
        "plugin_dir": config.plugin_dir.display().to_string(),
        "chain": chain_json,
        "view": view_json,
        "agent_max_ctx": config.agent_max_ctx,
        "max_users": config.max_users,
        "session_idle_timeout_minutes": config.session_idle_timeout_minutes,
        "on_plugin_error": config.on_plugin_error.as_str(),
        "required": config.required,
        "isolate": config.isolate,
        "models": models_json,
        "available": available_json,
        "discovery_error": statuses.as_ref().err().map(|e| e.to_string()),
    });
    (text, json)
}

/// `plugins` as text and JSON.
pub fn render_plugins(config: &Config, statuses: &[LibraryStatus]) -> (String, Value) {
    let mut text = String::new();
    let _ = writeln!(text, "plugin_dir: {}", config.plugin_dir.display());
    if statuses.is_empty() {
        let _ = writeln!(
            text,
            "no plugin libraries found (build and install them with `cargo xtask build`)"
        );
    }
    let name_width = statuses.iter().map(|s| s.name.len()).max().unwrap_or(0);
    let version_width = statuses
        .iter()
        .map(|s| s.version.as_deref().unwrap_or("-").len())
        .max()
        .unwrap_or(0);
    let file_name = |status: &LibraryStatus| {
        status
            .file
            .as_ref()
            .and_then(|f| f.file_name())
            .map(|f| f.to_string_lossy().to_string())
            .unwrap_or_else(|| "(no library)".to_string())
    };
    let file_width = statuses.iter().map(|s| file_name(s).len()).max().unwrap_or(0);
    for status in statuses {
        let enabled = match status.position {
            Some(p) if config.is_isolated(&status.name) => format!("enabled ({p}), isolated"),
            Some(p) => format!("enabled ({p})"),
            None => "not enabled".to_string(),
        };
        // A library that loads but whose table its plugin refuses is not one that does
        // not load: the fix is in the configuration, not the library.
        let loads = match (&status.config_error, status.available, status.loads) {
            (_, _, true) => "loads".to_string(),
            (Some(err), true, false) => {
                format!("loads, but its [plugin.{}] table is refused: {err}", status.name)
            }
            _ => format!(
                "DOES NOT LOAD: {}",
                status.reason.as_deref().unwrap_or("unknown reason")
            ),
        };
        let kind = if status.program { "program" } else { "library" };
        let _ = writeln!(
            text,
            "{:<name_width$}  {:<version_width$}  {:<file_width$}  {kind}  {loads}; {enabled}",
            status.name,
            status.version.as_deref().unwrap_or("-"),
            file_name(status),
        );
    }
    let json = json!({
        "config": config.file.display().to_string(),
        "plugin_dir": config.plugin_dir.display().to_string(),
        "plugins": statuses.iter().map(|s| json!({
            "name": s.name,
            "kind": if s.program { "program" } else { "library" },
            "version": s.version,
            "file": s.file.as_ref().map(|f| f.display().to_string()),
            "loads": s.loads,
            "available": s.available,
            "reason": s.reason,
            "config_error": s.config_error,
            "enabled": s.enabled,
            "position": s.position.map(|p| p.position),
            "list": s.position.map(|p| p.list()),
            "isolated": config.is_isolated(&s.name),
            "description": s.summary,
            "config_keys": keys_json(&s.config_keys),
        })).collect::<Vec<_>>(),
    });
    (text, json)
}

fn keys_json(keys: &[(String, String)]) -> Value {
    keys.iter()
        .map(|(name, meaning)| json!({"name": name, "meaning": meaning}))
        .collect()
}

/// `plugin-keys NAME`: the keys plugin `status` accepts in its `[plugin.NAME]` table, each
/// with its meaning, as text and JSON.
pub fn render_plugin_keys(status: &LibraryStatus) -> (String, Value) {
    let mut text = String::new();
    let version = status.version.as_deref().unwrap_or("-");
    let file = status
        .file
        .as_ref()
        .map(|f| f.display().to_string())
        .unwrap_or_default();
    if status.config_keys.is_empty() {
        let _ = writeln!(text, "{} {version} ({file}) accepts no keys", status.name);
    } else {
        let _ = writeln!(
            text,
            "{} {version} ({file}) accepts, in [plugin.{}]:",
            status.name, status.name
        );
        let width = status.config_keys.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        for (key, meaning) in &status.config_keys {
            let _ = writeln!(text, "  {key:<width$}  {}", echo::text(meaning));
        }
    }
    let json = json!({
        "name": status.name,
        "version": status.version,
        "file": status.file.as_ref().map(|f| f.display().to_string()),
        "config_keys": keys_json(&status.config_keys),
    });
    (text, json)
}

/// `check` as text and JSON.
pub fn render_check(report: &CheckReport) -> (String, Value) {
    let mut text = String::new();
    let _ = writeln!(text, "config: {}", report.config.display());
    for plugin in &report.plugins {
        let place = match plugin.position {
            Some(p) => p.to_string(),
            None => "not in the chain".to_string(),
        };
        let state = match &plugin.problem {
            None => "loads, config ok".to_string(),
            Some(problem) => format!("FAULT: {problem}"),
        };
        let _ = writeln!(
            text,
            "plugin {} {} ({place}): {state}",
            plugin.name,
            plugin.version.as_deref().unwrap_or("-")
        );
    }
    if !report.isolate.is_empty() {
        let _ = writeln!(
            text,
            "isolated (run in a worker process): {}",
            report.isolate.join(", ")
        );
    }
    for run in &report.runs {
        let _ = writeln!(
            text,
            "sample run, model {} (effective_ctx {}): {} -> {} messages",
            echo::bare(&run.model),
            run.effective_ctx,
            run.messages_in,
            run.messages_out
        );
        let width = run.stages.iter().map(|s| s.plugin.len()).max().unwrap_or(0);
        for stage in &run.stages {
            // The fault's words are in its problem line below, once for every model.
            let state = match &stage.fault {
                None => "ok",
                Some(_) => "FAULT (see the problem below)",
            };
            let _ = writeln!(
                text,
                "  {:<width$}  {} -> {} messages  {state}",
                stage.plugin, stage.messages_in, stage.messages_out
            );
        }
    }
    match &report.summarizer {
        None => {
            let _ = writeln!(
                text,
                "summarizer: none (plugins fall back: first characters, digests)"
            );
        }
        Some(s) => {
            let key = match &s.api_key_env {
                None => "no API key".to_string(),
                Some((name, true)) => format!("key from {name}"),
                Some((name, false)) => format!("key from {name} (NOT SET)"),
            };
            let _ = writeln!(
                text,
                "summarizer: {} model {}, {key}, timeout_ms {}",
                echo::bare(&s.endpoint),
                echo::bare(&s.model),
                s.timeout_ms
            );
        }
    }
    for warning in &report.warnings {
        let _ = writeln!(text, "warning: {warning}");
    }
    if report.ok() {
        let _ = writeln!(text, "check: ok");
    } else {
        for problem in &report.problems {
            let _ = writeln!(text, "problem: {problem}");
        }
        let _ = writeln!(text, "check: FAILED ({} problem(s))", report.problems.len());
    }
    let json = json!({
        "config": report.config.display().to_string(),
        "ok": report.ok(),
        "problems": report.problems,
        "warnings": report.warnings,
        "isolate": report.isolate,
        "plugins": report.plugins.iter().map(|p| json!({
            "name": p.name,
            "version": p.version,
            "position": p.position.map(|p| p.position),
            "list": p.position.map(|p| p.list()),
            "ok": p.ok,
            "problem": p.problem,
        })).collect::<Vec<_>>(),
        "summarizer": report.summarizer.as_ref().map(|s| json!({
            "endpoint": s.endpoint,
            "model": s.model,
            "timeout_ms": s.timeout_ms,
            "api_key_env": s.api_key_env.as_ref().map(|(name, _)| name),
            "api_key_set": s.api_key_env.as_ref().map(|(_, set)| set),
        })),
        "runs": report.runs.iter().map(|r| json!({
            "model": r.model,
            "effective_ctx": r.effective_ctx,
            "messages_in": r.messages_in,
            "messages_out": r.messages_out,
            "stages": r.stages.iter().map(|s| json!({
                "plugin": s.plugin,
                "messages_in": s.messages_in,
                "messages_out": s.messages_out,
                "tokens_in": s.tokens_in,
                "tokens_out": s.tokens_out,
                "ok": s.fault.is_none(),
                "fault": s.fault,
                "changed": s.changed,
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    });
    (text, json)
}
