//! The artifact's C .npy reader (runtime-stub/c/npy.c) on arbitrary files.
#![no_main]

use libfuzzer_sys::fuzz_target;

extern "C" {
    fn kiln_fuzz_npy(data: *const u8, len: usize) -> i32;
}

fuzz_target!(|data: &[u8]| {
    // SAFETY: the harness only reads `len` bytes from `data`.
    let rc = unsafe { kiln_fuzz_npy(data.as_ptr(), data.len()) };
    assert!(rc >= 0, "the harness could not write its memfd");
});
