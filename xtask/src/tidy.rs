//! Tidy tests: the map is checked (ARCHITECTURE.md, docs/). `cargo xtask test` runs them
//! with the workspace's tests, so a link to a missing file or heading, or a crate the map
//! does not name, fails the run where it is made.

#[cfg(test)]
mod tests {
    use std::collections::{BTreeSet, HashMap};
    use std::path::{Path, PathBuf};

    fn root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .unwrap()
            .to_path_buf()
    }

    /// The Markdown files the map is made of: README.md, ARCHITECTURE.md and docs/.
    fn map_files(root: &Path) -> Vec<PathBuf> {
        let mut files = vec![root.join("README.md"), root.join("ARCHITECTURE.md")];
        let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "md"))
            .collect();
        docs.sort();
        files.extend(docs);
        files
    }

    /// A heading's anchor as GitHub makes it: lower case, punctuation dropped (letters,
    /// digits, `-`, `_` and spaces kept), spaces become `-`.
    pub(super) fn anchor(heading: &str) -> String {
        heading
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect()
    }

    /// The anchors of a Markdown file's headings (outside fenced code), with GitHub's `-1`,
    /// `-2` … for repeats.
    pub(super) fn anchors(text: &str) -> BTreeSet<String> {
        let mut seen: HashMap<String, usize> = HashMap::new();
        let mut out = BTreeSet::new();
        let mut fenced = false;
        for line in text.lines() {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
                continue;
            }
            if fenced || !line.starts_with('#') {
                continue;
            }
            let heading = line.trim_start_matches('#');
            if !heading.starts_with(' ') {
                continue;
            }
            let base = anchor(heading);
            let count = seen.entry(base.clone()).or_insert(0);
            out.insert(if *count == 0 {
                base.clone()
            } else {
                format!("{base}-{count}")
            });
            *count += 1;
        }
        out
    }

    /// The link targets of a Markdown text outside fenced code and inline code: `](x)`.
    pub(super) fn links(text: &str) -> Vec<(usize, String)> {
        let mut out = Vec::new();
        let mut fenced = false;
        for (number, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
                continue;
            }
            if fenced {
                continue;
            }
            // Inline code spans are not links: cut them out first.
            let mut plain = String::new();
            for (i, part) in line.split('`').enumerate() {
                if i % 2 == 0 {
                    plain.push_str(part);
                }
            }
            let mut rest = plain.as_str();
            while let Some(at) = rest.find("](") {
                let after = &rest[at + 2..];
                match after.find(')') {
                    Some(end) => {
                        out.push((number + 1, after[..end].to_string()));
                        rest = &after[end..];
                    }
                    None => break,
                }
            }
        }
        out
    }

    #[test]
    fn every_link_of_the_map_points_at_a_file_and_heading_that_exist() {
        let root = root();
        let mut broken = Vec::new();
        for file in map_files(&root) {
            let text = std::fs::read_to_string(&file).unwrap();
            let dir = file.parent().unwrap();
            for (line, target) in links(&text) {
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                let (path, fragment) = match target.split_once('#') {
                    Some((path, fragment)) => (path, Some(fragment)),
                    None => (target.as_str(), None),
                };
                let linked = if path.is_empty() {
                    file.clone()
                } else {
                    dir.join(path)
                };
                let shown = format!("{}:{line}: {target}", file.strip_prefix(&root).unwrap().display());
                if !linked.exists() {
                    broken.push(format!("{shown}: no file {}", linked.display()));
                    continue;
                }
                if let Some(fragment) = fragment {
                    let headings = anchors(&std::fs::read_to_string(&linked).unwrap_or_default());
                    if !headings.contains(fragment) {
                        broken.push(format!("{shown}: no heading #{fragment}"));
                    }
                }
            }
        }
        assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    }

    /// Plain references into the docs, as code comments and the map write them:
    /// `docs/NAME.md#anchor` (or `NAME.md#anchor` inside docs/).
    pub(super) fn doc_references(text: &str) -> Vec<(usize, String, String)> {
        let mut out = Vec::new();
        for (number, line) in text.lines().enumerate() {
            let mut rest = line;
            while let Some(at) = rest.find(".md#") {
                let before = &rest[..at];
                let start = before
                    .rfind(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '/')))
                    .map_or(0, |i| i + 1);
                let after = &rest[at + 4..];
                let end = after
                    .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_')))
                    .unwrap_or(after.len());
                let file = format!("{}.md", &before[start..]);
                if !before[start..].is_empty() && end > 0 {
                    out.push((number + 1, file, after[..end].to_string()));
                }
                rest = &after[end..];
            }
        }
        out
    }

    /// Backticked repository paths of files (`engine/src/chain.rs`): each must exist.
    pub(super) fn file_paths(text: &str, top: &[String]) -> Vec<(usize, String)> {
        let mut out = Vec::new();
        for (number, line) in text.lines().enumerate() {
            for (i, part) in line.split('`').enumerate() {
                let is_file = [".rs", ".md", ".toml", ".py", ".json"]
                    .iter()
                    .any(|e| part.ends_with(e));
                let in_tree = part
                    .split_once('/')
                    .is_some_and(|(first, _)| top.iter().any(|t| t == first));
                if i % 2 == 1 && is_file && in_tree && !part.contains(['<', '*', ' ']) {
                    out.push((number + 1, part.to_string()));
                }
            }
        }
        out
    }

    /// Every `.rs` file of the workspace's own crates (not `target/`).
    fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            if path.is_dir() && name != "target" && !name.starts_with('.') {
                sources(&path, out);
            } else if name.ends_with(".rs") {
                out.push(path);
            }
        }
    }

    #[test]
    fn every_reference_into_the_docs_and_every_file_path_the_map_names_exists() {
        let root = root();
        let top: Vec<String> = std::fs::read_dir(&root)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_dir())
            .map(|p| p.file_name().unwrap().to_string_lossy().to_string())
            .filter(|n| !n.starts_with('.') && n != "target")
            .collect();
        let mut files = map_files(&root);
        let mut code = Vec::new();
        sources(&root, &mut code);
        // This file's own examples are not references.
        code.retain(|p| !p.ends_with("xtask/src/tidy.rs"));
        code.sort();
        files.extend(code);
        let mut broken = Vec::new();
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            let shown = file.strip_prefix(&root).unwrap().display().to_string();
            let in_docs = file.parent() == Some(root.join("docs").as_path());
            // `docs/FILE.md#section` in prose is a pattern, not a reference.
            let references = doc_references(&text).into_iter().filter(|(_, doc, _)| {
                !doc.trim_end_matches(".md")
                    .ends_with(|c: char| c.is_ascii_uppercase())
            });
            for (line, doc, fragment) in references {
                let path = if doc.starts_with("docs/") || !in_docs {
                    root.join(&doc)
                } else {
                    root.join("docs").join(&doc)
                };
                // `chain.md#x` outside docs/ names a doc by its bare name.
                let path = if path.exists() {
                    path
                } else {
                    root.join("docs").join(&doc)
                };
                match std::fs::read_to_string(&path) {
                    Err(_) => broken.push(format!("{shown}:{line}: {doc}#{fragment}: no file")),
                    Ok(target) if !anchors(&target).contains(&fragment) => {
                        broken.push(format!("{shown}:{line}: {doc}#{fragment}: no such heading"))
                    }
                    Ok(_) => {}
                }
            }
            if file.extension().is_some_and(|e| e == "md") {
                for (line, path) in file_paths(&text, &top) {
                    if !root.join(&path).exists() {
                        broken.push(format!("{shown}:{line}: {path}: no such file"));
                    }
                }
            }
        }
        assert!(
            broken.is_empty(),
            "references that lead nowhere:\n{}",
            broken.join("\n")
        );
    }

    #[test]
    fn every_workspace_crate_has_a_row_in_the_architecture_map() {
        let root = root();
        let map = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
        let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
        let document: toml_edit::DocumentMut = manifest.parse().unwrap();
        let members = document["workspace"]["members"].as_array().unwrap();
        let mut missing = Vec::new();
        for member in members.iter().filter_map(|m| m.as_str()) {
            // A row names the crate's path in backticks (`engine/`); plugins share one
            // row (`plugins/<name>/`), and the floor plugin is the bench's.
            let row = if member.starts_with("plugins/") {
                "`plugins/<name>/`".to_string()
            } else if member == "bench/floor-plugin" {
                "`bench/floor-plugin/`".to_string()
            } else {
                format!("`{member}/`")
            };
            if !map.contains(&row) {
                missing.push(format!("{member} (no {row} in ARCHITECTURE.md)"));
            }
        }
        assert!(missing.is_empty(), "crates without a row: {missing:?}");
    }

    /// The map's rules on dependencies (ARCHITECTURE.md, "Invariants at the crate
    /// boundaries"), over each workspace crate's normal dependencies, transitively.
    struct Rule {
        /// Crates (of anyone's) that only `allowed` may reach.
        forbidden: &'static [&'static str],
        allowed: &'static [&'static str],
        why: &'static str,
    }

    /// Binaries, and the harnesses that run them (tests, bench, fuzz).
    const BINARIES: &[&str] = &[
        "history-host",
        "agentctl",
        "xtask",
        "history-bench",
        "e2e-tests",
        "history-fuzz",
    ];

    const RULES: &[Rule] = &[
        Rule {
            forbidden: &["axum", "tower-http"],
            allowed: &["history-server"],
            why: "only `server` knows HTTP-server crates",
        },
        Rule {
            forbidden: &["clap", "tracing-subscriber", "agentctl"],
            allowed: &[],
            why: "only binaries parse command lines and set up logging",
        },
        Rule {
            forbidden: &[
                "rusqlite",
                "postgres",
                "tokio-postgres",
                "r2d2",
                "r2d2_postgres",
                "deadpool",
                "deadpool-postgres",
                "bb8",
                "sqlx",
            ],
            allowed: &["history-sessions", "history-server"],
            why: "nothing below `sessions` knows a database client",
        },
    ];

    /// Every rule broken by `graph` (crate → its normal dependencies) for `members`.
    pub(super) fn dependency_violations(
        graph: &HashMap<String, Vec<String>>,
        members: &[String],
    ) -> Vec<String> {
        let mut out = Vec::new();
        for member in members {
            if BINARIES.contains(&member.as_str()) {
                continue;
            }
            // Everything `member` reaches, with the path that reaches it.
            let mut reached: HashMap<&str, Vec<&str>> = HashMap::new();
            let mut stack = vec![(member.as_str(), vec![member.as_str()])];
            while let Some((name, path)) = stack.pop() {
                for dep in graph.get(name).into_iter().flatten() {
                    if !reached.contains_key(dep.as_str()) {
                        let mut next = path.clone();
                        next.push(dep);
                        reached.insert(dep, next.clone());
                        stack.push((dep, next));
                    }
                }
            }
            for rule in RULES {
                if rule.allowed.contains(&member.as_str()) {
                    continue;
                }
                for forbidden in rule.forbidden {
                    if let Some(path) = reached.get(forbidden) {
                        out.push(format!("{} ({}): {}", path.join(" -> "), rule.why, member));
                    }
                }
            }
        }
        out.sort();
        out
    }

    /// The workspace's dependency graph from `cargo metadata`: normal dependencies only.
    fn workspace_graph(root: &Path) -> (HashMap<String, Vec<String>>, Vec<String>) {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        // Offline first; a machine whose cache lacks another platform's crates (metadata
        // reads every package's manifest) fetches them once.
        let metadata = |offline: bool| {
            let mut command = std::process::Command::new(&cargo);
            command
                .args(["metadata", "--format-version", "1"])
                .current_dir(root);
            if offline {
                command.arg("--offline");
            }
            command.output().unwrap()
        };
        let output = match metadata(true) {
            output if output.status.success() => output,
            _ => metadata(false),
        };
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let metadata: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        let name_of: HashMap<&str, &str> = metadata["packages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (p["id"].as_str().unwrap(), p["name"].as_str().unwrap()))
            .collect();
        let members = metadata["workspace_members"]
            .as_array()
            .unwrap()
            .iter()
            .map(|id| name_of[id.as_str().unwrap()].to_string())
            .collect();
        let mut graph = HashMap::new();
        for node in metadata["resolve"]["nodes"].as_array().unwrap() {
            let deps = node["deps"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|d| {
                    d["dep_kinds"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|k| k["kind"].is_null())
                })
                .map(|d| name_of[d["pkg"].as_str().unwrap()].to_string())
                .collect();
            graph.insert(name_of[node["id"].as_str().unwrap()].to_string(), deps);
        }
        (graph, members)
    }

    #[test]
    fn no_crate_depends_on_what_the_map_forbids_it() {
        let (graph, members) = workspace_graph(&root());
        let broken = dependency_violations(&graph, &members);
        assert!(
            broken.is_empty(),
            "dependencies the map forbids:\n{}",
            broken.join("\n")
        );
    }

    #[test]
    fn a_forbidden_edge_is_found_with_the_path_that_reaches_it() {
        let graph: HashMap<String, Vec<String>> = [
            ("history-engine", vec!["plugin-api", "helper"]),
            ("helper", vec!["axum"]),
            ("history-server", vec!["history-engine", "axum"]),
            ("history-host", vec!["clap"]),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.into_iter().map(String::from).collect()))
        .collect();
        let members: Vec<String> = ["history-engine", "history-server", "history-host"]
            .into_iter()
            .map(String::from)
            .collect();
        assert_eq!(
            dependency_violations(&graph, &members),
            ["history-engine -> helper -> axum (only `server` knows HTTP-server crates): history-engine"]
        );
    }

    #[test]
    fn anchors_and_links_are_read_as_github_reads_them() {
        assert_eq!(
            anchor(" Sessions: `X-History-Session: ID`"),
            "sessions-x-history-session-id"
        );
        assert_eq!(anchor(" What goes upstream"), "what-goes-upstream");
        let text = "# A\n## A\n```\n# not\n```\nsee [x](b.md#a-1) and `[y](not.md)`\n";
        assert_eq!(
            anchors(text),
            BTreeSet::from(["a".to_string(), "a-1".to_string()])
        );
        assert_eq!(links(text), vec![(6, "b.md#a-1".to_string())]);
        assert_eq!(
            doc_references("see docs/chain.md#hot-reload, and plugins.md#expansion."),
            vec![
                (1, "docs/chain.md".to_string(), "hot-reload".to_string()),
                (1, "plugins.md".to_string(), "expansion".to_string())
            ]
        );
        let top = vec!["engine".to_string()];
        assert_eq!(
            file_paths("`engine/src/chain.rs` and `engine/` and `other/x.rs`", &top),
            vec![(1, "engine/src/chain.rs".to_string())]
        );
    }
}
