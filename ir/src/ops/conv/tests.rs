//! Unit tests of the conv family.
