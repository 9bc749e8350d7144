//! Keeping the operator's bytes: toml_edit normalizes a few things when it renders a
//! document (line endings, a byte-order mark, the final newline); this puts every line the
//! edit did not touch back exactly as the file had it.

use toml_edit::DocumentMut;

/// The edited text with every line the edit did not touch exactly as in `source`.
///
/// toml_edit keeps a document's text except for a few normalizations: it writes `\n`
/// line endings, drops a byte-order mark and ends the file with a line ending. So the
/// lines of the edited text that are unchanged from toml_edit's rendering of the original
/// (matched by a line diff) are written as the original's own lines, and new or changed
/// lines take the file's usual line ending.
pub(super) fn keep_untouched_lines(source: &str, edited: &str) -> String {
    const BOM: char = '\u{feff}';
    let (bom, body) = match source.strip_prefix(BOM) {
        Some(body) => (BOM.to_string(), body),
        None => (String::new(), source),
    };
    let Ok(original) = body.parse::<DocumentMut>() else {
        return edited.to_string();
    };
    let rendered = original.to_string();
    let bare = |line: &str| -> String {
        let line = line.strip_suffix('\n').unwrap_or(line);
        line.strip_suffix('\r').unwrap_or(line).to_string()
    };
    let src: Vec<&str> = body.split_inclusive('\n').collect();
    let old: Vec<&str> = rendered.split_inclusive('\n').collect();
    let new: Vec<&str> = edited.split_inclusive('\n').collect();
    if src.len() != old.len() || src.iter().zip(&old).any(|(s, o)| bare(s) != bare(o)) {
        // Not a line-for-line rendering: keep toml_edit's text as it is.
        return format!("{bom}{edited}");
    }
    let crlf_lines = src.iter().filter(|l| l.ends_with("\r\n")).count();
    let newline = if crlf_lines * 2 > src.iter().filter(|l| l.ends_with('\n')).count() {
        "\r\n"
    } else {
        "\n"
    };

    // Unchanged lines: the common start and end, then a longest common subsequence of
    // the (small) middle.
    let mut start = 0;
    while start < old.len() && start < new.len() && old[start] == new[start] {
        start += 1;
    }
    let mut end = 0;
    while end < old.len() - start
        && end < new.len() - start
        && old[old.len() - 1 - end] == new[new.len() - 1 - end]
    {
        end += 1;
    }
    let (old_mid, new_mid) = (&old[start..old.len() - end], &new[start..new.len() - end]);
    let mut lcs = vec![vec![0usize; new_mid.len() + 1]; old_mid.len() + 1];
    for i in (0..old_mid.len()).rev() {
        for j in (0..new_mid.len()).rev() {
            lcs[i][j] = if old_mid[i] == new_mid[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let mut origin: Vec<Option<usize>> = (0..start).map(Some).collect();
    let (mut i, mut j) = (0, 0);
    while j < new_mid.len() {
        if i < old_mid.len() && old_mid[i] == new_mid[j] {
            origin.push(Some(start + i));
            i += 1;
            j += 1;
        } else if i < old_mid.len() && lcs[i + 1][j] >= lcs[i][j + 1] {
            i += 1;
        } else {
            origin.push(None);
            j += 1;
        }
    }
    origin.extend((old.len() - end..old.len()).map(Some));

    let mut out = bom;
    let mut unterminated = false;
    for (line, origin) in new.iter().zip(origin) {
        if unterminated {
            // The original's last line had no line ending and is no longer last.
            out.push_str(newline);
        }
        unterminated = false;
        match origin {
            Some(k) => {
                out.push_str(src[k]);
                unterminated = !src[k].ends_with('\n');
            }
            None => match line.strip_suffix('\n') {
                Some(content) => {
                    out.push_str(content.strip_suffix('\r').unwrap_or(content));
                    out.push_str(newline);
                }
                None => out.push_str(line),
            },
        }
    }
    if !body.is_empty() && !body.ends_with('\n') {
        let trimmed = out.strip_suffix('\n').map(|o| o.strip_suffix('\r').unwrap_or(o));
        if let Some(trimmed) = trimmed {
            out.truncate(trimmed.len());
        }
    }
    out
}
