//! kiln's own .npy reader (frontend/src/npy.rs, used by `kiln run` and `kiln verify`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(e) = kiln_frontend::npy::parse_npy(data, "fuzz.npy") {
        assert!(!e.to_string().contains('\n'), "a multi-line error: {e}");
    }
});
