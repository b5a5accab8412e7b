//! Terminal styling: whether to color, and the few styles kiln uses. Colors go to stderr only
//! (diagnostics); stdout stays plain so that it can be piped and parsed.

use std::io::IsTerminal;
use std::sync::OnceLock;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ColorChoice {
    /// Color when stderr is a terminal and `NO_COLOR` is not set.
    Auto,
    Always,
    Never,
}

static COLOR: OnceLock<bool> = OnceLock::new();

/// Decides once, before anything is printed. `NO_COLOR` (https://no-color.org) turns color off
/// in `auto` mode; an explicit `--color always` still wins, as the convention asks.
pub fn init(choice: ColorChoice) {
    let on = match choice {
        ColorChoice::Always => true,
        ColorChoice::Never => false,
        ColorChoice::Auto => no_color_unset() && std::io::stderr().is_terminal(),
    };
    let _ = COLOR.set(on);
}

fn no_color_unset() -> bool {
    std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// The `--color` value on the command line, read before clap parses it so that clap's own
/// messages (usage errors, help) follow the same choice.
pub fn choice_from_args(args: &[std::ffi::OsString]) -> ColorChoice {
    let mut choice = ColorChoice::Auto;
    let mut iter = args.iter().map(|a| a.to_string_lossy());
    while let Some(a) = iter.next() {
        let value = if a == "--color" {
            iter.next().map(|v| v.into_owned())
        } else {
            a.strip_prefix("--color=").map(str::to_string)
        };
        match value.as_deref() {
            Some("always") => choice = ColorChoice::Always,
            Some("never") => choice = ColorChoice::Never,
            Some("auto") => choice = ColorChoice::Auto,
            _ => {}
        }
    }
    choice
}

pub fn enabled() -> bool {
    *COLOR.get().unwrap_or(&false)
}

/// clap's setting for the same choice.
pub fn clap_choice(choice: ColorChoice) -> clap::ColorChoice {
    match choice {
        ColorChoice::Auto if !no_color_unset() => clap::ColorChoice::Never,
        ColorChoice::Auto => clap::ColorChoice::Auto,
        ColorChoice::Always => clap::ColorChoice::Always,
        ColorChoice::Never => clap::ColorChoice::Never,
    }
}

#[derive(Clone, Copy)]
pub enum Style {
    Error,
    Good,
}

/// `text` wrapped in the style's ANSI codes when color is on.
pub fn paint(text: &str, style: Style) -> String {
    if !enabled() {
        return text.to_string();
    }
    let code = match style {
        Style::Error => "1;31",
        Style::Good => "1;32",
    };
    format!("\x1b[{code}m{text}\x1b[0m")
}
