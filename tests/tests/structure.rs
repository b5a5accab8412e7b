//! The source tree's shape, as docs/design.md describes it: no module of a crate imports a
//! module that imports it back (scripts/module_cycles.py), and no source file grows past
//! 1,500 lines (split by operator family or by job instead).

use kiln_tests::repo_root;
use std::path::{Path, PathBuf};
use std::process::Command;

const CRATES: &[&str] = &[
    "ir",
    "frontend",
    "optimizer",
    "codegen",
    "driver",
    "cli",
    "runtime-stub",
    "tests",
];
const MAX_LINES: usize = 1500;

#[test]
fn no_crate_has_an_import_cycle() {
    let root = repo_root();
    for krate in CRATES {
        let out = Command::new("python3")
            .arg(root.join("scripts/module_cycles.py"))
            .arg(root.join(krate).join("src"))
            .arg("--tests")
            .output()
            .expect("python3 runs scripts/module_cycles.py");
        assert!(
            out.status.success(),
            "{krate} has import cycles:\n{}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
}

fn sources(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let p = entry.path();
        if p.is_dir() {
            sources(&p, found);
        } else if p.extension().is_some_and(|e| e == "rs" || e == "c" || e == "h") {
            found.push(p);
        }
    }
}

#[test]
fn no_source_file_is_over_1500_lines() {
    let root = repo_root();
    let mut files = vec![];
    for krate in CRATES.iter().chain(&["fuzz"]) {
        for sub in ["src", "tests", "c", "ukernels", "fuzz_targets", "build.rs"] {
            let p = root.join(krate).join(sub);
            if p.is_dir() {
                sources(&p, &mut files);
            } else if p.is_file() {
                files.push(p);
            }
        }
    }
    assert!(files.len() > 100, "found only {} source files", files.len());
    let long: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let n = std::fs::read_to_string(f).ok()?.lines().count();
            (n > MAX_LINES).then(|| format!("{} ({n} lines)", f.strip_prefix(&root).unwrap().display()))
        })
        .collect();
    assert!(long.is_empty(), "split these by family or by job: {long:?}");
}
