//! Compiles the artifact's C .npy reader with clang, instrumented like the Rust code around it:
//! sanitizer coverage (so libFuzzer sees the C branches and comparisons) and AddressSanitizer.

fn main() {
    let stub = std::path::Path::new("../runtime-stub/c");
    for f in ["npy.c", "kiln_npy.h", "kiln_rt.h"] {
        println!("cargo:rerun-if-changed={}", stub.join(f).display());
    }
    println!("cargo:rerun-if-changed=c/npy_harness.c");
    println!("cargo:rerun-if-env-changed=KILN_CLANG");
    let clang = std::env::var("KILN_CLANG").unwrap_or_else(|_| "clang-19".into());
    let mut b = cc::Build::new();
    b.compiler(clang)
        .include(stub)
        .file(stub.join("npy.c"))
        .file("c/npy_harness.c")
        .flag("-std=gnu11")
        .flag("-g")
        .flag("-O1")
        .flag("-fno-omit-frame-pointer")
        .warnings_into_errors(true);
    // cargo fuzz builds with -Zsanitizer=address; a plain `cargo build` of this crate (to check
    // that it compiles) must not ask for sanitizer runtimes that will not be linked.
    if std::env::var("CARGO_CFG_SANITIZE").is_ok_and(|s| s.contains("address")) {
        b.flag("-fsanitize=fuzzer-no-link,address");
    }
    b.compile("kiln_npy_fuzz");
}
