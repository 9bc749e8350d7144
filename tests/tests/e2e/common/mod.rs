//! Shared by the property tests: one plugin instance loaded from the real cdylib and
//! applied directly, so a plugin can be applied twice to the same history with the same
//! host-derived turns (a chain cannot list a plugin twice, and a second chain run would
//! derive turns again from a history the plugin already shortened).

#![allow(dead_code)]

use history_engine::check::check_output;
use history_engine::Catalog;
use history_engine::{services, turns};
use history_wire::chat::{history_from_str, history_to_string};
use plugin_api::structure::Faults;
use plugin_api::{
    Context, LoadContext, Message, ModelInfo, PluginBox, RArc, ROption, RResult, RSlice, Tokenizer,
};

pub struct Plugin {
    instance: PluginBox,
}

fn model() -> ModelInfo {
    ModelInfo {
        name: "c4".into(),
        max_context: 200,
        context_tokens: 128_000,
        tokenizer: Tokenizer::Chars4,
        effective_ctx: 200,
    }
}

impl Plugin {
    /// Instantiates plugin `name` from `target/plugins` with its config table as JSON.
    pub fn load(name: &str, config_json: &str) -> Plugin {
        let catalog = Catalog::discover(&e2e_tests::plugin_dir()).unwrap();
        let library = catalog
            .library(name)
            .unwrap_or_else(|_| panic!("{name} is not installed"));
        let load = LoadContext {
            config_json: config_json.into(),
            agent_max_ctx: 200,
            models: vec![model()].into(),
            services: services::SERVICES,
        };
        let instance = library.instantiate(&load).unwrap_or_else(|e| panic!("{e}"));
        Plugin { instance }
    }

    /// One `process` call; the output must pass the host's check against its input.
    pub fn apply(&self, history: &[RArc<Message>], ctx: &Context) -> Result<Vec<RArc<Message>>, String> {
        let output = match self.instance.process(RSlice::from_slice(history), ctx) {
            RResult::ROk(output) => output,
            RResult::RErr(message) => return Err(format!("plugin error: {message}")),
        };
        let output: Vec<RArc<Message>> = output.history.into_iter().collect();
        check_output(history, Faults::of(history).count(), &output)
            .map_err(|e| format!("invalid output: {e}"))?;
        Ok(output)
    }
}

/// A stateless context at `turn` on a chars4 model.
pub fn context(turn: u64) -> Context {
    let model = model();
    Context {
        session_id: ROption::RNone,
        effective_ctx: model.effective_ctx,
        model,
        agent_max_ctx: 200,
        turn,
        last_active: ROption::RNone,
        expiration_override: ROption::RNone,
        services: services::SERVICES,
    }
}

/// Parses a history and gives it identities and turns as the host does before a chain.
pub fn prepared(json: &str, turn: u64) -> Vec<RArc<Message>> {
    let mut history = history_from_str(json).unwrap();
    turns::prepare(&mut history, turn);
    history
}

/// The wire text of a history, for comparisons.
pub fn text(history: &[RArc<Message>]) -> String {
    history_to_string(history)
}

/// Runs `f` on a thread with a large stack: generated histories nest strategies deeply,
/// and a debug build's frames for them can outgrow a test thread's 2 MiB.
pub fn on_big_stack(f: impl FnOnce() + Send) {
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .stack_size(64 << 20)
            .spawn_scoped(scope, f)
            .unwrap()
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    });
}

/// A property-test runner: 64 cases unless `PROPTEST_CASES` says otherwise, no
/// regression files (a failure prints the generated history itself).
pub fn runner() -> proptest::test_runner::TestRunner {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64);
    proptest::test_runner::TestRunner::new(proptest::test_runner::Config {
        cases,
        failure_persistence: None,
        ..proptest::test_runner::Config::default()
    })
}

/// The properties every plugin of the chain must have on generated histories, for each
/// config `(TOML table body, the same table as JSON)`: through `config(toml)` the turn
/// passes the host's check under `on_plugin_error = "fail"`; applied directly, the plugin
/// adds no message (or, with `keeps_count`, changes no count), invents nothing, and
/// applying it twice with the same turns gives what applying it once gave.
pub fn check_properties(
    plugin: &str,
    config: impl Fn(&str) -> e2e_tests::TestConfig + Sync,
    tables: &[(&str, &str)],
    keeps_count: bool,
) {
    use proptest::test_runner::TestCaseError;
    on_big_stack(|| {
        for (toml, json) in tables {
            let config = config(toml);
            let instance = Plugin::load(plugin, json);
            let strategy = (e2e_tests::histories::history(), 1u64..9);
            runner()
                .run(&strategy, |(history, turn)| {
                    let fail =
                        |what: String| TestCaseError::fail(format!("{what}\nconfig {toml:?}\n{history}"));
                    let run = config
                        .run("c4", &history, Some(turn))
                        .map_err(|e| fail(e.to_string()))?;
                    let stage = run.stages.iter().find(|s| s.plugin == plugin).unwrap();
                    if keeps_count && stage.messages_in != stage.messages_out {
                        return Err(fail("the message count changed in the chain".into()));
                    }
                    let input = prepared(&history, turn);
                    let ctx = context(turn);
                    let once = instance.apply(&input, &ctx).map_err(fail)?;
                    let twice = instance.apply(&once, &ctx).map_err(fail)?;
                    if once.len() > input.len() || (keeps_count && once.len() != input.len()) {
                        return Err(fail(format!("{} messages in, {} out", input.len(), once.len())));
                    }
                    if text(&once) != text(&twice) {
                        return Err(fail(format!(
                            "not idempotent:\nonce  {}\ntwice {}",
                            text(&once),
                            text(&twice)
                        )));
                    }
                    Ok(())
                })
                .unwrap();
        }
    });
}
