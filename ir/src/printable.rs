//! Model strings made safe to print.
//!
//! Names in a model (nodes, values, inputs, external data locations) are untrusted text: an ESC
//! sequence in a node name would reach the user's terminal through an error message, `kiln
//! inspect` or `kiln explain`, and a newline would forge extra lines. Everything kiln prints
//! that came from a model goes through [`printable`].

use std::borrow::Cow;

/// `s` with every control character (C0, DEL and C1, newlines included) written as a Rust-style
/// escape (`\u{1b}`, `\0`, `\n`, `\t`); other characters, non-ASCII ones included, are kept.
pub fn printable(s: &str) -> Cow<'_, str> {
    if !s.chars().any(char::is_control) {
        return Cow::Borrowed(s);
    }
    Cow::Owned(escape_controls(s, |_| true))
}

/// `text` with the control characters that `escape` selects written as escapes; the others
/// pass through. Output sinks that may carry their own line breaks keep `\n` this way.
pub fn escape_controls(text: &str, escape: impl Fn(char) -> bool) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() && escape(c) {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_every_control_character() {
        assert_eq!(printable("relu_1"), "relu_1");
        assert_eq!(printable("conv.ü/中"), "conv.ü/中");
        assert_eq!(printable("a\u{1b}[2Jb"), "a\\u{1b}[2Jb");
        assert_eq!(
            printable("a\0b\nc\td\u{7f}e\u{9b}f"),
            "a\\0b\\nc\\td\\u{7f}e\\u{9b}f"
        );
    }

    #[test]
    fn a_sink_can_keep_its_own_line_breaks() {
        let s = escape_controls("x\u{1b}]0;t\u{7}\ny\n", |c| c != '\n');
        assert_eq!(s, "x\\u{1b}]0;t\\u{7}\ny\n");
    }
}
