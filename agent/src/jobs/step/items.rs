//! A listing's stdout as item ids: one a line, checked as the line arrives.

/// Items a listing may produce. A run's items each become rows and jobs at
/// the server; a million is well past any batch we expect (a 10k-page
/// scan) and still fits in memory at [`MAX_ID_BYTES`] each.
pub const MAX_ITEMS: usize = 1_000_000;

/// An id names paths (`{id}` in templates), so it stays far below a file
/// name's 255-byte limit once a stage adds a suffix; 256 is the limit of
/// what is accepted at all.
pub const MAX_ID_BYTES: usize = 256;

/// Why a listing's line is not an item id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ItemError {
    #[error("line {line} of the listing, {id:?}, is not an item id: {why}")]
    BadId {
        /// 1-based, counting every line of the listing's stdout.
        line: usize,
        id: String,
        why: &'static str,
    },
    #[error("the listing printed more than {MAX_ITEMS} items")]
    TooMany,
}

/// The items of a listing so far.
#[derive(Debug, Default)]
pub struct Items {
    items: Vec<String>,
    lines: usize,
}

impl Items {
    /// Takes the next line of stdout: trimmed, an empty one skipped,
    /// anything else an id or the error that fails the listing.
    pub fn push_line(&mut self, line: &str) -> Result<(), ItemError> {
        self.lines += 1;
        let id = line.trim();
        if id.is_empty() {
            return Ok(());
        }
        let bad = |why| ItemError::BadId {
            line: self.lines,
            id: id.chars().take(80).collect(),
            why,
        };
        if id.len() > MAX_ID_BYTES {
            return Err(bad("longer than 256 bytes"));
        }
        if id == "." || id == ".." {
            return Err(bad("`.` and `..` name directories, not items"));
        }
        if id.contains('/') {
            return Err(bad("it holds a `/`"));
        }
        if id.chars().any(char::is_control) {
            return Err(bad("it holds a control character"));
        }
        if self.items.len() == MAX_ITEMS {
            return Err(ItemError::TooMany);
        }
        self.items.push(id.to_string());
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn into_vec(self) -> Vec<String> {
        self.items
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_trimmed_and_empty_ones_skipped() {
        let mut items = Items::default();
        for l in ["  a ", "", "b c", "\t", "ü-1.pdf\r"] {
            items.push_line(l).unwrap();
        }
        assert_eq!(items.into_vec(), vec!["a", "b c", "ü-1.pdf"]);
    }

    #[test]
    fn bad_ids_name_their_line() {
        let long = "x".repeat(MAX_ID_BYTES + 1);
        for (bad, why) in [
            ("a/b", "/"),
            ("..", "`.`"),
            (".", "`.`"),
            ("a\u{1b}b", "control"),
            (long.as_str(), "256"),
        ] {
            let mut items = Items::default();
            items.push_line("ok").unwrap();
            items.push_line("").unwrap();
            let e = items.push_line(bad).unwrap_err();
            let text = e.to_string();
            assert!(text.contains("line 3"), "{text}");
            assert!(text.contains(why), "{text}");
        }
        let mut items = Items::default();
        items.push_line(&"x".repeat(MAX_ID_BYTES)).unwrap();
    }

    #[test]
    fn more_than_the_limit_fails() {
        let mut items = Items {
            items: vec![String::new(); MAX_ITEMS],
            lines: MAX_ITEMS,
        };
        assert_eq!(items.push_line("one more"), Err(ItemError::TooMany));
    }
}
