//! The check the host runs on every plugin's output before passing it on
//! (docs/chain.md, "The output check"): a non-empty input does not come out empty, the
//! shape is valid, there are no more structural faults than the plugin's input had, and
//! nothing is invented.
//!
//! It lives here, in the crate every plugin depends on, so that a plugin's own tests run
//! the very code the host runs (`plugin_testing::check`): an output the host would
//! refuse fails the author's `cargo test` with the host's message.

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use plugin_api::echo;
use plugin_api::structure::Faults;
use plugin_api::{Content, Member, Message, Part, RArc, Role};

/// Whether `output` is `input` passed through untouched (same shared messages in order).
pub fn is_passthrough(input: &[RArc<Message>], output: &[RArc<Message>]) -> bool {
    input.len() == output.len() && input.iter().zip(output).all(|(a, b)| std::ptr::eq(&**a, &**b))
}

/// Whether `output` is `input` with messages left out: the same shared messages, in input
/// order. What every trimming plugin returns; with unique identities in the input (as in a
/// chain run, `turns::assign_origins`) such an output duplicates, changes and invents
/// nothing, so only [`check_faults`] is left to check — without hashing the whole input.
pub fn is_selection(input: &[RArc<Message>], output: &[RArc<Message>]) -> bool {
    let mut rest = input.iter();
    output.len() <= input.len()
        && output
            .iter()
            .all(|kept| rest.any(|m| std::ptr::eq(&**m, &**kept)))
}

/// Identity of a message within one chain step: its origin, its kind of role and, for a
/// tool result, the call it answers (one assistant message's placeholders share its origin).
type Key<'a> = (u64, Role, Option<&'a str>);

fn key(message: &Message) -> Key<'_> {
    let role = if message.role.is_system() {
        Role::System
    } else {
        message.role
    };
    (
        message.origin(),
        role,
        (role == Role::Tool).then(|| message.call_id().unwrap_or("")),
    )
}

/// The never-empty rule: a plugin handed a non-empty history returns a non-empty one (an
/// empty history is no request a provider takes, and nothing the plugin could repair).
pub fn check_not_emptied(input: &[RArc<Message>], output: &[RArc<Message>]) -> Result<(), String> {
    if output.is_empty() && !input.is_empty() {
        return Err(format!(
            "empty history returned for {} messages (a non-empty history never comes out empty)",
            input.len()
        ));
    }
    Ok(())
}

/// The whole check of one stage, as the host runs it between two plugins: `output`
/// against `input`, which had `input_faults` structural faults and unique message
/// identities (the host numbers messages before the chain). Returns the number of the
/// output's structural faults, or the refusal (`invalid output: output message 3: …`)
/// that the host reports as the plugin's error.
pub fn check_stage(
    input: &[RArc<Message>],
    input_faults: usize,
    output: &[RArc<Message>],
) -> Result<usize, String> {
    if is_passthrough(input, output) {
        return Ok(input_faults);
    }
    // Identities are unique here, so a plain selection needs only the structural check,
    // not the full one that hashes the input.
    if is_selection(input, output) {
        check_not_emptied(input, output).and_then(|()| check_faults(output, input_faults))
    } else {
        check_output(input, input_faults, output)
    }
    .map(|faults| faults.count())
    .map_err(|e| format!("invalid output: {e}"))
}

/// [`check_stage`] for a call that recalled messages from the session's transcript
/// (`ctx.recall`, docs/chain.md#the-output-check): a recalled message counts as one more
/// input message, so the plugin may put it into its output as it came or changed, under
/// its own identity. A recalled message whose identity the input already has (the
/// message itself, or a compacted copy of it) is left out: it would appear twice.
pub fn check_stage_recalled(
    input: &[RArc<Message>],
    input_faults: usize,
    output: &[RArc<Message>],
    recalled: &[RArc<Message>],
) -> Result<usize, String> {
    if recalled.is_empty() || is_passthrough(input, output) || is_selection(input, output) {
        return check_stage(input, input_faults, output);
    }
    let origins: HashSet<u64> = input.iter().map(|m| m.origin()).collect();
    let mut known = input.to_vec();
    let mut added: HashSet<u64> = HashSet::default();
    known.extend(
        recalled
            .iter()
            .filter(|m| !origins.contains(&m.origin()) && added.insert(m.origin()))
            .cloned(),
    );
    // The full check, not `check_stage`'s selection path: a recalled message may stand
    // anywhere in the output.
    check_output(&known, input_faults, output)
        .map(|faults| faults.count())
        .map_err(|e| format!("invalid output: {e}"))
}

/// Checks one plugin's output against its input. Returns the output's structural faults,
/// or the first problem found (naming the index of the output message).
pub fn check_output(
    input: &[RArc<Message>],
    input_faults: usize,
    output: &[RArc<Message>],
) -> Result<Faults, String> {
    check_not_emptied(input, output)?;
    let shared: HashSet<*const Message> = input.iter().map(|m| &**m as *const Message).collect();
    let by_key: HashMap<Key<'_>, &Message> = input.iter().map(|m| (key(m), &**m)).collect();
    let origins: HashMap<u64, Role> = input.iter().map(|m| (m.origin(), m.role)).collect();
    let mut seen: HashSet<Key<'_>> = HashSet::with_capacity_and_hasher(output.len(), Default::default());
    // (origin, call id) of the calls of the input's assistant messages, made when a new
    // tool result first needs it: a plugin may answer thousands of one message's calls.
    let mut input_calls: Option<HashSet<(u64, &str)>> = None;
    let mut summaries = 0usize;

    for (index, message) in output.iter().enumerate() {
        let fault = |what: String| format!("output message {index}: {what}");
        let made = !shared.contains(&(&**message as *const Message)) && !by_key.contains_key(&key(message));
        if let Some(ids) = made.then(|| summary_ids(message)).flatten() {
            check_summary(input, output, &ids, &mut summaries).map_err(fault)?;
            check_shape(message).map_err(fault)?;
            continue;
        }
        if !seen.insert(key(message)) {
            return Err(fault("duplicated (the same input message appears twice)".into()));
        }
        if shared.contains(&(&**message as *const Message)) {
            continue;
        }
        if by_key.contains_key(&key(message)) {
            // A changed copy, or a merge kept under its first message's identity.
        } else if message.role == Role::Tool
            && by_key.contains_key(&(message.origin(), Role::Assistant, None))
        {
            let id = message.call_id().unwrap_or("");
            let calls = input_calls.get_or_insert_with(|| {
                by_key
                    .iter()
                    .filter(|((_, role, _), _)| *role == Role::Assistant)
                    .flat_map(|((origin, _, _), call)| {
                        call.tool_calls.iter().map(|c| (*origin, c.id.as_str()))
                    })
                    .collect()
            });
            if !calls.contains(&(message.origin(), id)) {
                return Err(fault(format!(
                    "tool result {} answers none of the calls of the message it was made from",
                    echo::quoted(id)
                )));
            }
        } else if let Some(role) = origins.get(&message.origin()) {
            return Err(fault(if message.role == Role::Tool && *role == Role::Tool {
                "a tool result's tool_call_id was changed".to_string()
            } else {
                format!("role changed from {} to {}", role.as_str(), message.role.as_str())
            }));
        } else {
            return Err(fault(
                "invented (it is neither an input message nor made from one)".into(),
            ));
        }
        check_shape(message).map_err(fault)?;
    }

    check_faults(output, input_faults)
}

/// The `summary_of` of a message that may be a summary: a `user` or `system` message
/// carrying the list.
fn summary_ids(message: &Message) -> Option<Vec<String>> {
    if message.role != Role::User && !message.role.is_system() {
        return None;
    }
    message.meta()?.summary_of()
}

/// A summary (docs/chain.md#the-output-check): at most one new one per output; it lists at
/// least one id, each naming an input message (its [`Message::identity`]), none of which
/// is in the output (itself or a changed copy).
fn check_summary(
    input: &[RArc<Message>],
    output: &[RArc<Message>],
    ids: &[String],
    summaries: &mut usize,
) -> Result<(), String> {
    *summaries += 1;
    if *summaries > 1 {
        return Err("a second summary message (one summary replaces one range)".into());
    }
    if ids.is_empty() {
        return Err("a summary whose summary_of lists no message".into());
    }
    let input_ids: HashMap<String, u64> = input.iter().map(|m| (m.identity(), m.origin())).collect();
    let output_origins: HashSet<u64> = output.iter().map(|m| m.origin()).collect();
    let output_ids: HashSet<String> = output.iter().filter_map(|m| m.id().map(str::to_string)).collect();
    for id in ids {
        let Some(origin) = input_ids.get(id) else {
            return Err(format!(
                "a summary of {}, which is not an input message",
                echo::quoted(id)
            ));
        };
        if output_origins.contains(origin) || output_ids.contains(id) {
            return Err(format!(
                "a summary of {}, which is still in the output",
                echo::quoted(id)
            ));
        }
    }
    Ok(())
}

/// The output's structural faults, or an error when it has more than its input had.
pub fn check_faults(output: &[RArc<Message>], input_faults: usize) -> Result<Faults, String> {
    let faults = Faults::of(output);
    if faults.count() > input_faults {
        let first = faults.describe(output).into_iter().next().unwrap_or_default();
        return Err(format!(
            "output has {} structural faults where its input had {input_faults}; first: {first}",
            faults.count()
        ));
    }
    Ok(faults)
}

/// The docs/wire-format.md#input-checks shape rules a typed message can still break: what a plugin built or changed.
pub fn check_shape(message: &Message) -> Result<(), String> {
    if message.role == Role::Tool && message.tool_call_id.is_none() {
        return Err("tool message without tool_call_id".into());
    }
    if message.role != Role::Assistant && !message.tool_calls.is_empty() {
        return Err(format!("tool_calls on a {} message", message.role.as_str()));
    }
    check_members(&message.extra)?;
    check_content(&message.content)?;
    for call in message.tool_calls.iter() {
        check_members(&call.extra)?;
        check_members(&call.function_extra)?;
        if call.arguments_is_json {
            valid_json(&call.arguments)
                .map_err(|e| format!("tool call {}: arguments: {e}", echo::quoted(&call.id)))?;
        }
    }
    if let Some(meta) = message.meta() {
        if meta.turn_added.into_option() == Some(0) {
            return Err("metadata.turn_added must be ≥ 1".into());
        }
        check_members(&meta.extra)?;
        if let Some(expiration) = meta.expiration.as_ref().into_option() {
            check_members(&expiration.extra)?;
        }
        if let Some(original) = meta.original_content.as_ref().into_option() {
            check_content(original)?;
        }
    }
    // Every kept member is JSON: now none may shadow a modelled field or be given twice.
    plugin_api::faithful::check_faithful(message)
}

fn check_content(content: &Content) -> Result<(), String> {
    if let Content::Parts(parts) = content {
        for part in parts.iter() {
            match part {
                Part::Opaque { json } => match serde_json::from_str::<serde_json::Value>(json) {
                    Ok(serde_json::Value::Object(_)) => {}
                    _ => return Err("a content part is not a JSON object".into()),
                },
                Part::Text { extra, .. } => check_members(extra)?,
            }
        }
    }
    Ok(())
}

fn check_members(members: &[Member]) -> Result<(), String> {
    for member in members {
        valid_json(&member.json).map_err(|e| format!("member {}: {e}", echo::quoted(&member.key)))?;
    }
    Ok(())
}

fn valid_json(text: &str) -> Result<(), String> {
    serde_json::from_str::<serde_json::Value>(text)
        .map(|_| ())
        .map_err(|_| "not valid JSON".to_string())
}
