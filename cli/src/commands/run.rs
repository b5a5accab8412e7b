//! `kiln run`: run a model on input files.

use crate::model_args::ModelArgs;
use crate::tensors::{output_file_name, read_inputs, summarize};
use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,

    /// An input value: NAME=FILE (.npy, or .pb ONNX TensorProto). May be repeated; a bare FILE
    /// is enough for single-input models.
    #[arg(long = "input", short = 'i', value_name = "NAME=FILE")]
    pub inputs: Vec<String>,

    /// Write each output to DIR/<output name>.npy (created if missing).
    #[arg(long, short = 'o', value_name = "DIR")]
    pub output_dir: Option<PathBuf>,

    /// Run the reference interpreter (ir::eval) instead of compiled code.
    #[arg(long)]
    pub reference: bool,

    /// Print nothing but errors.
    #[arg(long, short = 'q')]
    pub quiet: bool,
}

pub fn run(args: Args) -> Result<()> {
    if !args.reference {
        bail!("this build of kiln runs models through the reference interpreter only: pass --reference");
    }
    let model = args.model.load()?;
    let inputs = read_inputs(&model.graph, &args.inputs)?;
    let start = Instant::now();
    let outputs = kiln_ir::eval::eval_graph_named(&model.graph, inputs)
        .with_context(|| format!("{}", args.model.model.display()))?;
    let elapsed = start.elapsed();
    if let Some(dir) = &args.output_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    for (out, t) in model.graph.outputs().iter().zip(&outputs) {
        if let Some(dir) = &args.output_dir {
            let path = dir.join(output_file_name(&out.name));
            kiln_frontend::npy::write_npy(&path, t)
                .with_context(|| format!("cannot write {}", path.display()))?;
        }
        if !args.quiet {
            crate::emit(&format!("{}: {}\n", out.name, summarize(t)));
        }
    }
    if !args.quiet {
        let written = match &args.output_dir {
            Some(d) => format!(", outputs written to {}", d.display()),
            None => String::new(),
        };
        eprintln!("reference run took {:.3} s{written}", elapsed.as_secs_f64());
    }
    Ok(())
}
