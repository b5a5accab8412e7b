//! Every fixture model compiled for the CUDA target (`--emit ptx`, the fixture suite's models
//! and bound inputs) for sm_80 and sm_90, and once more with `--precision bf16` for sm_80 (the
//! tensor-core kernels), each PTX assembled by `ptxas` for its SM: the PTX the driver will load
//! must be valid, which needs no GPU. The f32 plans must also keep to `LIBRARY_KERNELS`: which
//! fixtures still run C library kernels on the GPU, and how many. Without ptxas the test is skipped,
//! except under CI (`$CI` set), where the PTX must be checked.
//! `KILN_FIXTURE_FILTER=substr` runs a subset; `KILN_PTXAS` names the ptxas to use.

use kiln_codegen::Emit;
use kiln_tests::compiled::{compile_graph_cuda, compile_graph_cuda_bf16, WorkDir};
use kiln_tests::cuda::{export_libdevice, ptxas, ptxas_check, run_parallel, CHECKED_SM};
use kiln_tests::fixtures::{load_manifest, Fixture};
use std::path::Path;
use std::time::{Duration, Instant};

/// The SM the bf16 (tensor-core) PTX is checked for.
const BF16_SM: u32 = 80;

/// The fixtures whose f32 GPU plan still runs some operators as C library kernels on one GPU
/// block, and how many: every other fixture must compile to generated GPU kernels only, and a
/// listed one to exactly this many (when a new GPU kernel lowers the count, lower it here).
const LIBRARY_KERNELS: &[(&str, usize)] = &[];

/// One fixture for one SM, f32 or bf16: compile, then assemble. Returns the time of each step
/// and the number of library kernels in the plan.
fn check(f: &Fixture, sm: u32, bf16: bool, ptxas: &Path) -> Result<(Duration, Duration, usize), String> {
    let (graph, _) = f.prepared().map_err(|e| format!("{e:#}"))?;
    let work = WorkDir::new(&format!("{}-sm{sm}{}", f.name, if bf16 { "-bf16" } else { "" }));
    let ptx = work.0.join(format!("{}.ptx", f.name));
    let start = Instant::now();
    let summary = if bf16 {
        compile_graph_cuda_bf16(&graph, &f.name, sm, Emit::Ptx, &ptx)?
    } else {
        compile_graph_cuda(&graph, &f.name, sm, Emit::Ptx, &ptx)?
    };
    let compiled = start.elapsed();
    ptxas_check(ptxas, &ptx, sm)?;
    let library = summary.kernels - summary.generated_kernels;
    Ok((compiled, start.elapsed() - compiled, library))
}

#[test]
fn fixtures_ptx_assembles_with_ptxas() {
    let Some(ptxas) = ptxas() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "ptxas not found and CI must check PTX: install it with scripts/setup.sh (nvidia-cuda-nvcc-cu12) or set KILN_PTXAS"
        );
        println!("skipped: ptxas not found (scripts/setup.sh installs it)");
        return;
    };
    export_libdevice();
    let fixtures = load_manifest().expect("fixtures/manifest.json");
    assert!(!fixtures.is_empty(), "no fixtures in the manifest");
    let fixtures = Fixture::filtered(&fixtures);
    let jobs: Vec<(&Fixture, u32, bool)> = fixtures
        .iter()
        .flat_map(|f| {
            CHECKED_SM
                .iter()
                .map(move |&sm| (*f, sm, false))
                .chain(std::iter::once((*f, BF16_SM, true)))
        })
        .collect();
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let start = Instant::now();
    let label = |sm: u32, bf16: bool| format!("sm_{sm}{}", if bf16 { " bf16" } else { "" });
    let results = run_parallel(&jobs, threads, |(f, sm, bf16)| {
        let r = check(f, *sm, *bf16, &ptxas);
        match &r {
            Ok((c, a, _)) => println!(
                "ok   {} {} (compile {:.2} s, ptxas {:.2} s)",
                f.name,
                label(*sm, *bf16),
                c.as_secs_f64(),
                a.as_secs_f64()
            ),
            Err(e) => println!("FAIL {} {}: {e}", f.name, label(*sm, *bf16)),
        }
        r
    });
    let failed: Vec<String> = jobs
        .iter()
        .zip(&results)
        .filter(|(_, r)| r.is_err())
        .map(|((f, sm, bf16), _)| format!("{} ({})", f.name, label(*sm, *bf16)))
        .collect();
    let mut slowest: Vec<(f64, String)> = jobs
        .iter()
        .zip(&results)
        .filter_map(|((f, sm, bf16), r)| {
            r.as_ref().ok().map(|(c, a, _)| {
                (
                    (*c + *a).as_secs_f64(),
                    format!("{} {}", f.name, label(*sm, *bf16)),
                )
            })
        })
        .collect();
    slowest.sort_by(|a, b| b.0.total_cmp(&a.0));
    let slowest: Vec<String> = slowest
        .iter()
        .take(5)
        .map(|(t, n)| format!("{n} {t:.1} s"))
        .collect();
    println!(
        "cuda ptx: {} passed, {} failed ({} fixtures × sm {:?} f32 + sm_{BF16_SM} bf16 with {}, {} threads, {:.1} s; slowest: {})",
        jobs.len() - failed.len(),
        failed.len(),
        fixtures.len(),
        CHECKED_SM,
        ptxas.display(),
        threads,
        start.elapsed().as_secs_f64(),
        slowest.join(", ")
    );
    assert!(failed.is_empty(), "PTX failing: {}", failed.join(", "));
    // Library kernels on the GPU, from the f32 plans for the newest checked SM.
    let sm = *CHECKED_SM.last().expect("an SM");
    let mut wrong = vec![];
    for ((f, job_sm, bf16), r) in jobs.iter().zip(&results) {
        let Ok((_, _, library)) = r else { continue };
        if *bf16 || *job_sm != sm {
            continue;
        }
        let listed = LIBRARY_KERNELS
            .iter()
            .find(|(n, _)| *n == f.name)
            .map_or(0, |(_, c)| *c);
        if *library != listed {
            wrong.push(format!("{}: {library} library kernels, listed {listed}", f.name));
        }
    }
    assert!(
        wrong.is_empty(),
        "GPU library kernels differ from LIBRARY_KERNELS (update the list when a GPU kernel \
         removes some; a new one needs a GPU kernel): {}",
        wrong.join("; ")
    );
}
