//! Every real conversation through the full shipped chain under a tight budget: valid
//! output, the task kept, tool results replaced rather than removed, and tokens saved.

use e2e_tests::{plugin_dir, real_conversations, workspace_root, TestConfig};
use plugin_api::structure::Faults;
use plugin_api::{EventKind, Role};

/// The shipped `plugins-enabled.toml`, pointed at the installed plugins, failing on any
/// plugin fault, with a tight model: 8,192 tokens minus the 4,096 reserve.
fn shipped_config_with_a_tight_model() -> TestConfig {
    let shipped = std::fs::read_to_string(workspace_root().join("plugins-enabled.toml")).unwrap();
    let mut text = String::new();
    for line in shipped.lines() {
        if line.starts_with("plugin_dir") {
            text.push_str(&format!(
                "plugin_dir = {:?}\n",
                plugin_dir().display().to_string()
            ));
        } else if line.starts_with("on_plugin_error") {
            text.push_str("on_plugin_error = \"fail\"\n");
        } else {
            text.push_str(line);
            text.push('\n');
        }
    }
    text.push_str("\n[models.tight]\nmax_context = 200\ncontext_tokens = 8192\ntokenizer = \"o200k_base\"\n");
    TestConfig::new(&text)
}

#[test]
fn the_shipped_chain_is_the_full_chain() {
    let config = shipped_config_with_a_tight_model();
    let (loaded, _, chain) = history_engine::load_chain(&config.path).unwrap();
    assert_eq!(
        chain.names(),
        ["default", "tool_result_filter", "retention", "token_budget",]
    );
    assert_eq!(chain.view_names(), ["role_pair"]);
    assert_eq!(loaded.model("tight").context_tokens, 8192);
}

#[test]
fn real_conversations_through_the_full_chain_under_a_tight_budget() {
    let config = shipped_config_with_a_tight_model();
    let (mut tokens_before, mut tokens_after) = (0u64, 0u64);
    for (name, text) in real_conversations() {
        let input = history_wire::chat::history_from_str(&text).unwrap();
        let run = config
            .run("tight", &text, None)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let output = &run.history;

        // Valid for the provider: no structural fault, user first after the system prompt.
        assert_eq!(
            Faults::of(output).count(),
            0,
            "{name}: {:?}",
            Faults::of(output).describe(output)
        );

        // The task is kept in single-user agent loops.
        let users: Vec<_> = input.iter().filter(|m| m.role == Role::User).collect();
        if users.len() == 1 {
            assert!(
                output
                    .iter()
                    .any(|m| m.role == Role::User && m.content == users[0].content),
                "{name}: the task is kept"
            );
        }

        // tool_result_filter replaces old results, it never removes a message.
        let filter = run
            .stages
            .iter()
            .find(|s| s.plugin == "tool_result_filter")
            .unwrap();
        assert_eq!(filter.messages_in, filter.messages_out, "{name}");
        // Empty results are "no longer than min_chars = 0": left alone and not counted.
        let tools = input
            .iter()
            .filter(|m| m.role == Role::Tool && m.content.char_count() > 0)
            .count();
        let omitted = filter
            .events
            .iter()
            .filter(|e| e.kind == EventKind::MessageOmitted)
            .count();
        if tools > 4 && filter.messages_in == input.len() {
            assert!(omitted > 0, "{name}: {tools} tool results, none replaced");
        }

        // Within the budget, or the never-empty rule said so.
        let budget = run.stages.iter().find(|s| s.plugin == "token_budget").unwrap();
        let over = budget.events.iter().any(|e| e.kind == EventKind::OverBudget);
        assert!(
            over || budget.tokens_out <= 8192 - 4096,
            "{name}: {} tokens",
            budget.tokens_out
        );
        assert!(
            run.tokens_out <= run.tokens_in,
            "{name}: never more tokens than came in"
        );
        tokens_before += run.tokens_in;
        tokens_after += run.tokens_out;
    }
    eprintln!("real conversations, full chain, tight model: {tokens_before} -> {tokens_after} tokens");
    assert!(
        tokens_after < tokens_before,
        "{tokens_before} -> {tokens_after}: the chain saves tokens"
    );
}
