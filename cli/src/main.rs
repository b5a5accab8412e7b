//! The `kiln` command line.

mod commands;
mod diagnostic;
mod exit;
mod model_args;
mod report_text;
mod tensors;
mod term;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use std::process::ExitCode;

/// kiln — an ahead-of-time compiler for trained models.
///
/// kiln imports ONNX models (weights inline, as external data, or in safetensors files),
/// optimizes them and compiles them to self-contained executables and static libraries.
#[derive(Parser)]
#[command(name = "kiln", version, about, long_about = None, propagate_version = true)]
struct Cli {
    /// Color diagnostics on stderr: auto (when stderr is a terminal and NO_COLOR is unset),
    /// always, never.
    #[arg(long, value_enum, global = true, default_value = "auto", value_name = "WHEN")]
    color: term::ColorChoice,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show a model's inputs, outputs, opset, operators, parameters and estimated FLOPs.
    Inspect(commands::inspect::Args),
    /// Compile a model to an executable, a static library + C header, an object, LLVM IR or assembly.
    Compile(commands::compile::Args),
    /// Run a model on input files and write or show its outputs.
    Run(commands::run::Args),
    /// Show where every node of a model goes when compiled (kernels, fusion, layout, dtype,
    /// memory plan, CPU features) without generating code. Takes the `compile` options.
    Explain(commands::explain::Args),
    /// Compile and run a model, compare every output and every kernel's result with the reference interpreter, and name the pass or kernel behind a mismatch (exit 1).
    Verify(commands::verify::Args),
    /// Reduce a model that fails a check (a shell command, `compile` or `verify`) to the smallest model that still fails it.
    Minify(commands::minify::Args),
}

fn main() -> ExitCode {
    // A panic is a kiln bug: say so on one line and exit with the documented status instead of
    // Rust's 101 and a backtrace hint.
    std::panic::set_hook(Box::new(|info| {
        eprintln!(
            "{} internal error (a kiln bug, please report it with the model): {info}",
            term::paint("error:", term::Style::Error)
        );
        std::process::exit(i32::from(exit::Exit::Internal.code()));
    }));
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let color = term::choice_from_args(&args);
    term::init(color);
    let matches = Cli::command()
        .color(term::clap_choice(color))
        .get_matches_from(&args);
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let name = cli.command.name();
    let report = cli.command.report_path().map(std::path::Path::to_path_buf);
    let result = match cli.command {
        Command::Inspect(args) => commands::inspect::run(args),
        Command::Compile(args) => commands::compile::run(args),
        Command::Run(args) => commands::run::run(args),
        Command::Explain(args) => commands::explain::run(args),
        Command::Verify(args) => commands::verify::run(args),
        Command::Minify(args) => commands::minify::run(args),
    };
    match result {
        Ok(()) => ExitCode::from(exit::Exit::Success.code()),
        Err(e) => {
            let message = one_line(&e);
            // Errors quote model names: no control character from a model reaches the terminal,
            // and the error stays on one line.
            eprintln!(
                "{} {}",
                term::paint("error:", term::Style::Error),
                kiln_ir::printable(&message)
            );
            // CI reads the report file whether the command worked or not: on failure it says
            // why, where, and with which exit status.
            if let Some(path) = report {
                let doc = diagnostic::failure_report(name, &e, &message);
                if let Err(w) = diagnostic::write_json(&doc, &path) {
                    eprintln!("{} {}", term::paint("error:", term::Style::Error), one_line(&w));
                }
            }
            ExitCode::from(exit::classify(&e).code())
        }
    }
}

impl Command {
    fn name(&self) -> &'static str {
        match self {
            Command::Inspect(_) => "inspect",
            Command::Compile(_) => "compile",
            Command::Run(_) => "run",
            Command::Explain(_) => "explain",
            Command::Verify(_) => "verify",
            Command::Minify(_) => "minify",
        }
    }

    /// The command's `--report FILE`, if it was given.
    fn report_path(&self) -> Option<&std::path::Path> {
        match self {
            Command::Inspect(a) => a.report.as_deref(),
            Command::Compile(a) => a.report.as_deref(),
            Command::Run(a) => a.report.as_deref(),
            Command::Explain(a) => a.compile.report.as_deref(),
            Command::Verify(a) => a.report.as_deref(),
            Command::Minify(a) => a.report.as_deref(),
        }
    }
}

/// Writes command output to stdout. A closed pipe (`kiln inspect m.onnx | head`) ends the
/// program quietly instead of panicking like `println!` would.
pub fn emit(text: &str) {
    use std::io::Write;
    // The last line of defence for model strings that reach stdout: control characters other
    // than kiln's own line breaks and tabs are escaped.
    let text = kiln_ir::escape_controls(text, |c| c != '\n' && c != '\t');
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("error: cannot write output: {e}");
        std::process::exit(1);
    }
}

/// The error and its causes on one line (`outer: inner: root`), skipping causes whose text the
/// outer message already contains.
fn one_line(e: &anyhow::Error) -> String {
    let mut msg = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !msg.contains(&c) {
            msg.push_str(": ");
            msg.push_str(&c);
        }
    }
    msg
}
