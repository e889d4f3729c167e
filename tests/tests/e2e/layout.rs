//! The source tree keeps to the conventions a reader relies on.

use std::path::{Path, PathBuf};

/// The longest a file's opening line may be: it says what the file holds,
/// in a line a listing shows whole (`../shared/CONVENTIONS.md`).
const OPENING_LINE_MAX: usize = 120;

/// Every `.rs` file under a crate's `src/` in the workspace.
fn sources(root: &Path) -> Vec<PathBuf> {
    // Build outputs, fuzz corpora and hidden folders hold no sources of
    // ours.
    let ours = |d: &Path| {
        let name = d
            .file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default();
        !(name.starts_with('.') || name == "target" || name == "node_modules")
    };
    flotilla_e2e::files_under(root, ours)
        .into_iter()
        .filter(|p| {
            p.extension().is_some_and(|e| e == "rs")
                && p.components().any(|c| c.as_os_str() == "src")
        })
        .collect()
}

#[test]
fn every_source_file_opens_with_one_short_line_saying_what_it_holds() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let files = sources(&root);
    assert!(
        files.len() > 100,
        "found only {} sources under {}",
        files.len(),
        root.display()
    );
    let mut wrong = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let first = text.lines().next().unwrap_or_default();
        let shown = f.strip_prefix(&root).unwrap_or(f).display();
        if !first.starts_with("//!") {
            wrong.push(format!("{shown}: opens with {first:?}, not a `//!` line"));
        } else if first.chars().count() > OPENING_LINE_MAX {
            wrong.push(format!(
                "{shown}: its opening line has {} characters (at most {OPENING_LINE_MAX}; \
                 put the rest in the paragraph below it)",
                first.chars().count()
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
