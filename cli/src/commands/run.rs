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

    /// Run the reference interpreter (ir::eval) instead of compiling the model for this
    /// machine and running the compiled code.
    #[arg(long)]
    pub reference: bool,

    /// Threads for the compiled run (default: one per CPU).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,

    /// Print nothing but errors.
    #[arg(long, short = 'q')]
    pub quiet: bool,
}

pub fn run(args: Args) -> Result<()> {
    let model = args.model.load()?;
    if !args.reference {
        return run_compiled(&args, model);
    }
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

/// Compiles the model for this machine into a temporary executable and runs it on the inputs:
/// the same code `kiln compile` would produce, without keeping the artifact.
fn run_compiled(args: &Args, model: kiln_frontend::Model) -> Result<()> {
    let inputs = read_inputs(&model.graph, &args.inputs)?;
    let mut graph = model.graph;
    kiln_optimizer::cpu_pipeline().run(&mut graph)?;
    let dir = tempfile::tempdir().context("cannot create a temporary folder")?;
    let exe = dir.path().join("model");
    let opts = kiln_codegen::CompileOptions {
        fusion: true,
        name: "model".to_string(),
        target: kiln_codegen::TargetDesc::host()?,
        emit: kiln_codegen::Emit::Exe,
        cc: std::env::var("CC").unwrap_or_else(|_| "cc".to_string()),
        weights_out: None,
    };
    kiln_codegen::compile(&graph, &opts, &exe, &mut kiln_codegen::Silent)
        .with_context(|| format!("{}", args.model.model.display()))?;
    let mut cmd = std::process::Command::new(&exe);
    for (i, (name, _)) in graph.input_types().enumerate() {
        let t = &inputs[name];
        let path = dir.path().join(format!("input{i}.npy"));
        kiln_frontend::npy::write_npy(&path, t)
            .with_context(|| format!("cannot write {}", path.display()))?;
        cmd.arg("--input").arg(format!("{name}={}", path.display()));
    }
    if let Some(d) = &args.output_dir {
        cmd.arg("--output-dir").arg(d);
    }
    if let Some(t) = args.threads {
        cmd.arg("--threads").arg(t.to_string());
    }
    if args.quiet {
        cmd.arg("--quiet");
    }
    let status = cmd.status().context("cannot run the compiled model")?;
    if !status.success() {
        bail!("the compiled model failed ({status})");
    }
    Ok(())
}
