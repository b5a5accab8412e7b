//! The C API of a compiled model: the names of the functions every artifact exports, shared by
//! the module emitter (`emit`), the header writer (`header`) and the profiling hooks (`profile`).

/// The C API of one model: the names every artifact exports.
pub struct Api {
    pub prefix: String,
    /// The profiling functions are part of the API (`kiln compile --profile`).
    pub profile: bool,
    /// The weights file's name (no folder) when the weights live outside the binary
    /// (`--weights-out`): the API then has `NAME_create_with_weights`.
    pub weights_file: Option<String>,
    /// A CUDA model (`--target cuda`): the API adds `NAME_create_on_device` and
    /// `NAME_run_device` (device pointers, a stream).
    pub cuda: bool,
}

impl Api {
    pub fn symbol(&self, what: &str) -> String {
        format!("{}_{what}", self.prefix)
    }

    pub fn exported(&self, with_main: bool) -> Vec<String> {
        let mut v: Vec<String> = [
            "create",
            "destroy",
            "run",
            "run_generic",
            "run_shaped",
            "last_output_shape",
            "last_error",
            "workspace_size",
            "info",
            "input_count",
            "input_name",
            "input_dtype",
            "input_shape",
            "output_count",
            "output_name",
            "output_dtype",
            "output_shape",
        ]
        .iter()
        .map(|w| self.symbol(w))
        .collect();
        if self.profile {
            v.extend(PROFILE_FUNCTIONS.iter().map(|w| self.symbol(w)));
        }
        if self.weights_file.is_some() {
            v.push(self.symbol("create_with_weights"));
        }
        if self.cuda {
            v.push(self.symbol("create_on_device"));
            v.push(self.symbol("run_device"));
            if self.weights_file.is_some() {
                v.push(self.symbol("create_with_weights_on_device"));
            }
        }
        if with_main {
            v.push("main".to_string());
        }
        v
    }
}

/// The profiling functions of a model's C API (present only when compiled with `--profile`).
pub const PROFILE_FUNCTIONS: [&str; 3] = ["profile_enable", "profile_kernels", "profile_write_trace"];
