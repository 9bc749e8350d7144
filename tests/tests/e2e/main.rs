//! The end-to-end tests: one test binary (linked once, so a cold `cargo xtask test` does
//! not link a binary per file), one module per concern. They run the real binaries
//! (`history-host`, `agentctl`) and load the real plugin libraries that `cargo xtask
//! build` installed; fixture plugins are built by `e2e_tests::fixtures`. Shared helpers
//! live in the `e2e_tests` library (`tests/src`) and, for the property tests, `common`.

mod common;

mod agentctl;
mod agentctl_plugins;
mod anthropic;
mod bad_input;
mod config_errors;
mod connections;
mod deadline;
mod dedupe;
mod default_plugin;
mod expand_explain;
mod fanout;
mod faults;
mod full_chain;
mod hardening_check;
mod hardening_load;
mod hardening_output;
mod host_services;
mod ingest;
mod inspector;
mod isolation;
mod mcp_hosts;
mod media;
mod metrics;
mod process_cli;
mod process_plugins;
mod properties;
mod proxy;
mod recall;
mod recall_relevance;
mod relevance;
mod reload;
mod responses;
mod retention;
mod rewriting;
mod role_pair;
mod scaffold;
mod sessions_chat;
mod sessions_commands;
mod sessions_hosts;
mod sessions_http;
mod sessions_http_delta;
mod sessions_load;
mod sessions_store;
mod store_outage;
mod summarize;
mod summarizer;
mod token_budget;
mod tool_result_filter;
mod wire_fidelity;
mod working_history;
