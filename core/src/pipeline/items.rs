//! A run's item ids: what a listing may print, checked where it is printed
//! (the agent, line by line) and again where it is acted on (the server,
//! before any id reaches a path), and how much of them one report may carry.

/// Items a listing may produce. A run's items each become rows and jobs at
/// the server; a million is well past any batch we expect (a 10k-page
/// scan) and still fits in memory at [`MAX_ID_BYTES`] each.
pub const MAX_ITEMS: usize = 1_000_000;

/// An id names paths (`{id}` in templates), so it stays far below a file
/// name's 255-byte limit once a stage adds a suffix; 256 is the limit of
/// what is accepted at all.
pub const MAX_ID_BYTES: usize = 256;

/// The most a listing's or a probe's list may take as JSON. A job's
/// completion carries it whole, and the server takes a completion of at most
/// [`crate::protocol::MAX_COMPLETE_BYTES`]; this leaves room for the rest of
/// the report. A million 20-character ids take 23 MB.
pub const MAX_LIST_JSON_BYTES: usize = 24 << 20;

/// Why `id` is not an item id, or `None` when it is one.
pub fn id_problem(id: &str) -> Option<&'static str> {
    if id.is_empty() {
        return Some("it is empty");
    }
    if id.len() > MAX_ID_BYTES {
        return Some("longer than 256 bytes");
    }
    if id == "." || id == ".." {
        return Some("`.` and `..` name directories, not items");
    }
    if id.contains('/') {
        return Some("it holds a `/`");
    }
    if id.chars().any(char::is_control) {
        return Some("it holds a control character");
    }
    if id.trim() != id {
        return Some("it starts or ends with white space");
    }
    None
}

/// What `s` adds to a JSON list of strings: its bytes, the escapes serde
/// writes for `"` and `\` (control characters are never in an id or a
/// path here), two quotes and a comma.
pub fn json_bytes(s: &str) -> usize {
    s.len() + s.bytes().filter(|b| matches!(b, b'"' | b'\\')).count() + 3
}

/// The size, as the report carries it, of a list of strings being made:
/// what a listing's ids or a probe's found paths take as JSON, to be held
/// under [`MAX_LIST_JSON_BYTES`] as they arrive.
#[derive(Debug, Default, Clone, Copy)]
pub struct ListSize(usize);

impl ListSize {
    /// Counts `s` in; whether the list still fits.
    pub fn add(&mut self, s: &str) -> bool {
        self.0 += json_bytes(s);
        self.0 <= MAX_LIST_JSON_BYTES
    }
}

/// Checks a listing's ids as the server receives them: the first that is
/// not an id, or a count past [`MAX_ITEMS`], is the error, naming it.
pub fn check_ids(ids: &[String]) -> Result<(), String> {
    if ids.len() > MAX_ITEMS {
        return Err(format!(
            "the listing has {} items, more than {MAX_ITEMS}",
            ids.len()
        ));
    }
    for (n, id) in ids.iter().enumerate() {
        if let Some(why) = id_problem(id) {
            let shown: String = id.chars().take(80).collect();
            return Err(format!(
                "item {} of the listing, {shown:?}, is not an item id: {why}",
                n + 1
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_that_would_leave_their_directory_or_break_a_line_are_refused() {
        for (bad, why) in [
            ("", "empty"),
            ("a/b", "/"),
            ("../x", "/"),
            ("..", "`.`"),
            (".", "`.`"),
            ("a\nb", "control"),
            ("a\u{1b}b", "control"),
            (" a", "white space"),
        ] {
            assert!(id_problem(bad).is_some_and(|w| w.contains(why)), "{bad:?}");
        }
        assert!(id_problem(&"x".repeat(MAX_ID_BYTES + 1)).is_some());
        for good in ["a", "b c", "ü-1.pdf", &"x".repeat(MAX_ID_BYTES), "$(x)"] {
            assert_eq!(id_problem(good), None, "{good:?}");
        }
        let e = check_ids(&["a".into(), "../x".into()]).unwrap_err();
        assert!(e.contains("item 2") && e.contains("../x"), "{e}");
    }

    #[test]
    fn json_bytes_is_what_serde_writes() {
        let ids = vec!["a".to_string(), "q\"uo\\te".into(), "ü-1.pdf".into()];
        let sum: usize = ids.iter().map(|s| json_bytes(s)).sum();
        // `[` and `]`, and no comma after the last: one more in all.
        assert_eq!(serde_json::to_vec(&ids).unwrap().len(), sum + 1);
    }
}
