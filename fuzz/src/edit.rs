//! agentctl's layout-keeping edits on generated configurations: a random edit of a random
//! valid file either is refused (and nothing is written) or gives a text that parses, says
//! what the edit asked for, and has every line outside the edited value byte for byte as
//! before.

use std::ops::Range;
use std::path::Path;

use history_engine::config::edit::{apply, Edit};
use history_engine::Config;

use crate::gen::{self, Choices, Generated};

fn edit(c: &mut Choices) -> Edit {
    let name = || -> &'static [&'static str] {
        &[
            "default",
            "retention",
            "role_pair",
            "summarize",
            "token_budget",
            "tool_result_filter",
            "nope",
            "Bad Name",
            "",
        ]
    };
    match c.below(6) {
        0 => Edit::ChainAdd {
            name: c.pick(name()).to_string(),
            at: if c.flag() { None } else { Some(c.below(8)) },
            view: c.flag(),
        },
        1 => Edit::ChainRemove {
            name: c.pick(name()).to_string(),
        },
        2 => Edit::ChainMove {
            name: c.pick(name()).to_string(),
            to: c.below(8),
        },
        3 => Edit::MaxCtx(c.pick(&[0, 1, 7, 200, u64::MAX])),
        4 => Edit::MaxUsers(c.pick(&[0, 1, 50, u64::MAX])),
        _ => Edit::SessionTimeout(c.pick(&[0, 1, 60, u64::MAX])),
    }
}

/// Lines with their endings; the last one may lack one.
fn lines(text: &str) -> Vec<&str> {
    text.split_inclusive('\n').collect()
}

/// The lines of `before` that changed in `after`: the range between the common first
/// and last lines (a last line that only gained a line ending counts as the same).
fn changed(before: &str, after: &str) -> (Range<usize>, usize) {
    let (old, new) = (lines(before), lines(after));
    let same = |a: &str, b: &str| {
        a == b || a.trim_end_matches(['\r', '\n']) == b.trim_end_matches(['\r', '\n']) && !a.ends_with('\n')
    };
    let prefix = old.iter().zip(&new).take_while(|(a, b)| same(a, b)).count();
    let suffix = old[prefix..]
        .iter()
        .rev()
        .zip(new[prefix..].iter().rev())
        .take_while(|(a, b)| same(a, b))
        .count();
    (prefix..old.len() - suffix, new.len() - suffix - prefix)
}

/// Where an edit may change lines: the edited value's own lines (a range of the old text),
/// or, when the file lacks it, nothing old (lines are only added).
fn allowed(generated: &Generated, edit: &Edit, config: &Config) -> Option<Range<usize>> {
    let one = |line: Option<usize>| line.map(|l| l..l + 1);
    match edit {
        Edit::ChainAdd { view: false, .. } => generated.chain.clone(),
        Edit::ChainAdd { view: true, .. } => generated.view.clone(),
        Edit::ChainRemove { name } | Edit::ChainMove { name, .. } => {
            if config.view.contains(name) {
                generated.view.clone()
            } else {
                generated.chain.clone()
            }
        }
        Edit::MaxCtx(_) => one(generated.agent_max_ctx),
        Edit::MaxUsers(_) => one(generated.max_users),
        Edit::SessionTimeout(_) => one(generated.session_timeout),
        Edit::Require { .. }
        | Edit::Unrequire { .. }
        | Edit::PluginSet { .. }
        | Edit::PluginUnset { .. }
        | Edit::Isolate { .. }
        | Edit::Unisolate { .. } => {
            unreachable!("the generator makes no `required`, `isolate` or plugin-table edits")
        }
    }
}

/// What the edited configuration must say.
fn check_result(edit: &Edit, before: &Config, after: &Config) {
    match edit {
        Edit::ChainAdd { name, at, view } => {
            let list = if *view { &after.view } else { &after.chain };
            let was = if *view { &before.view } else { &before.chain };
            let at = at.unwrap_or(was.len());
            assert_eq!(list.get(at), Some(name), "added at its position");
            assert_eq!(list.len(), was.len() + 1);
        }
        Edit::ChainRemove { name } => {
            assert!(
                !after.chain.contains(name) && !after.view.contains(name),
                "removed"
            );
            assert_eq!(
                after.chain.len() + after.view.len() + 1,
                before.chain.len() + before.view.len()
            );
        }
        Edit::ChainMove { name, to } => {
            let list = if before.view.contains(name) {
                &after.view
            } else {
                &after.chain
            };
            assert_eq!(list.get(*to), Some(name), "moved to its position");
        }
        Edit::MaxCtx(n) => assert_eq!(after.agent_max_ctx, *n),
        Edit::MaxUsers(n) => assert_eq!(after.max_users, *n),
        Edit::SessionTimeout(n) => assert_eq!(after.session_idle_timeout_minutes, *n),
        Edit::Require { name } => assert!(after.required.contains(name), "required"),
        Edit::Unrequire { name } => assert!(!after.required.contains(name), "not required"),
        Edit::PluginSet { name, key, .. } => assert!(
            after
                .plugins
                .iter()
                .any(|t| &t.name == name && t.json.get(key).is_some()),
            "set"
        ),
        Edit::PluginUnset { name, key } => assert!(
            !after
                .plugins
                .iter()
                .any(|t| &t.name == name && t.json.get(key).is_some()),
            "unset"
        ),
        Edit::Isolate { name } => assert!(after.isolate.contains(name), "isolated"),
        Edit::Unisolate { name } => assert!(!after.isolate.contains(name), "not isolated"),
    }
    let lists_kept = matches!(
        edit,
        Edit::MaxCtx(_) | Edit::MaxUsers(_) | Edit::SessionTimeout(_)
    );
    if lists_kept {
        assert_eq!(
            (&after.chain, &after.view),
            (&before.chain, &before.view),
            "the lists are kept"
        );
    }
    if !matches!(edit, Edit::MaxCtx(_)) {
        assert_eq!(after.agent_max_ctx, before.agent_max_ctx);
    }
    if !matches!(edit, Edit::MaxUsers(_)) {
        assert_eq!(after.max_users, before.max_users);
    }
    if !matches!(edit, Edit::SessionTimeout(_)) {
        assert_eq!(
            after.session_idle_timeout_minutes,
            before.session_idle_timeout_minutes
        );
    }
}

/// The target: a generated file, an edit, and the checks above.
pub fn agentctl_edit(data: &[u8]) {
    let mut c = Choices::new(data);
    let generated = gen::config(&mut c);
    let edit = edit(&mut c);
    let file = Path::new("fuzz/plugins-enabled.toml");
    let Ok(before) = Config::parse(file, generated.text.clone()) else {
        return; // a layout the host refuses (e.g. a table written twice): nothing to edit
    };
    let Ok(planned) = apply(file, &generated.text, &edit, None) else {
        return; // refused: `apply` returns no text, so nothing can be written
    };
    let after = Config::parse(file, planned.text.clone())
        .unwrap_or_else(|e| panic!("the edited text parses: {e}\n{}", planned.text));
    check_result(&edit, &before, &after);
    if planned.text == generated.text {
        return;
    }
    let (old, new_lines) = changed(&generated.text, &planned.text);
    match allowed(&generated, &edit, &before) {
        Some(range) => assert!(
            range.start <= old.start && old.end <= range.end,
            "lines {old:?} changed outside the edited value {range:?}:\n{}\n---\n{}",
            generated.text,
            planned.text
        ),
        None => assert!(
            old.is_empty() && new_lines <= 4,
            "a missing key is added without changing lines ({old:?}, {new_lines} new):\n{}\n---\n{}",
            generated.text,
            planned.text
        ),
    }
}
