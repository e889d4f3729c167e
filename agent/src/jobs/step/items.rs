//! A listing's stdout as item ids: one a line, checked as the line arrives.

use flotilla_core::pipeline::items::{id_problem, ListSize};
pub use flotilla_core::pipeline::items::{MAX_ID_BYTES, MAX_ITEMS, MAX_LIST_JSON_BYTES};

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
    #[error(
        "the listing's items take more than {} MiB as the report carries them \
         (at line {line}); list fewer or shorter ids, or split the run",
        MAX_LIST_JSON_BYTES >> 20
    )]
    TooLarge { line: usize },
}

/// The items of a listing so far.
#[derive(Debug, Default)]
pub struct Items {
    items: Vec<String>,
    lines: usize,
    /// What `items` takes in the report.
    size: ListSize,
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
        if let Some(why) = id_problem(id) {
            return Err(bad(why));
        }
        if self.items.len() == MAX_ITEMS {
            return Err(ItemError::TooMany);
        }
        if !self.size.add(id) {
            return Err(ItemError::TooLarge { line: self.lines });
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
            size: ListSize::default(),
        };
        assert_eq!(items.push_line("one more"), Err(ItemError::TooMany));
    }

    /// Review of 3877596, F2: a listing the server could not take in one
    /// report (it then refused the completion, and the run failed three
    /// lease expiries later as if the agent had stopped) fails at once.
    #[test]
    fn more_than_a_report_carries_fails_naming_the_limit() {
        let id = "x".repeat(200);
        let mut items = Items::default();
        let fit = MAX_LIST_JSON_BYTES / flotilla_core::pipeline::items::json_bytes(&id);
        for _ in 0..fit {
            items.push_line(&id).unwrap();
        }
        let e = items.push_line(&id).unwrap_err();
        assert_eq!(e, ItemError::TooLarge { line: fit + 1 });
        assert!(e.to_string().contains("24 MiB"), "{e}");
        let json = serde_json::to_vec(&items.into_vec()).unwrap();
        assert!(json.len() <= MAX_LIST_JSON_BYTES, "{}", json.len());
    }
}
