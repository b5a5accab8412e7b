pub mod inspect;
pub mod run;
