//! `kiln explain`: `kiln compile`'s options, stopping after the plan to print where every node
//! of the model went (as a table or JSON, formatted by [`crate::report_text`]).

use anyhow::Result;

#[derive(clap::Args, Debug)]
#[group(id = "ExplainArgs")]
pub struct Args {
    /// Takes every `kiln compile` option, so a compile command line explains by changing the
    /// subcommand; -o is ignored and --emit only decides the default CPU (portable for
    /// libraries and objects), --report still writes the JSON.
    #[command(flatten)]
    pub compile: super::compile::Args,

    /// Print the report as JSON (the same document as `kiln compile --report`).
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> Result<()> {
    let mode = if args.json {
        super::compile::Mode::ExplainJson
    } else {
        super::compile::Mode::ExplainTable
    };
    super::compile::build(args.compile, mode)
}
