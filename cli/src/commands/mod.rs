pub mod compile;
pub mod explain;
pub mod inspect;
pub mod minify;
pub mod run;
pub mod verify;
