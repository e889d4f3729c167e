//! Cutting text to a byte limit without splitting a character.

/// Shortens `text` to at most `max_bytes` bytes, at the last character
/// boundary at or before the limit (`String::truncate` panics inside a
/// multi-byte character; `str::floor_char_boundary` is not stable yet).
pub fn truncate_on_char_boundary(text: &mut String, max_bytes: usize) {
    if text.len() <= max_bytes {
        return;
    }
    let mut end = max_bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_before_a_multi_byte_character_never_inside_it() {
        // '€' is three bytes: 4096 is not a boundary of 2000 of them.
        let mut euros = "€".repeat(2000);
        truncate_on_char_boundary(&mut euros, 4096);
        assert_eq!(euros.len(), 4095);
        assert!(euros.chars().all(|c| c == '€'));
        let mut short = "short".to_string();
        truncate_on_char_boundary(&mut short, 4096);
        assert_eq!(short, "short");
        let mut exact = "ab€".to_string();
        truncate_on_char_boundary(&mut exact, 5);
        assert_eq!(exact, "ab€");
        truncate_on_char_boundary(&mut exact, 4);
        assert_eq!(exact, "ab");
    }
}
