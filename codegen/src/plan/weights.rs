//! The weights blob as the planner fills it: constants and packed weights at 64-byte aligned
//! offsets, kept in memory or streamed into a weights object's data section as they come.
//!
//! Linked artifacts on x86_64 and aarch64 take their weights as an object of their own
//! (`weights_object`); streaming them there as each kernel packs its constants means the
//! packed copy of the model's weights never sits in memory next to the graph's (GPT-2 small:
//! 0.6 GB less peak memory). Everything else (weights embedded in the module, a
//! `--weights-out` file, portable variants compared blob by blob, the PTX emulator) reads the
//! bytes from memory.

use super::ALIGN;
use crate::error::{CodegenError, Result};
use crate::weights_object::{ObjectWriter, TempObject};

pub struct Weights {
    sink: Sink,
    /// The first write error of a streamed blob, reported when the plan is finished.
    error: Option<CodegenError>,
}

enum Sink {
    Memory(Vec<u8>),
    Object(ObjectWriter),
    /// A streamed blob whose object was finished (`Weights::finish_object`): its length stays.
    Finished(u64),
}

impl Weights {
    pub fn in_memory() -> Weights {
        Weights {
            sink: Sink::Memory(vec![]),
            error: None,
        }
    }

    pub fn streamed(writer: ObjectWriter) -> Weights {
        Weights {
            sink: Sink::Object(writer),
            error: None,
        }
    }

    pub fn len(&self) -> usize {
        match &self.sink {
            Sink::Memory(v) => v.len(),
            Sink::Object(w) => w.data_len() as usize,
            Sink::Finished(n) => *n as usize,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends `bytes` at the next aligned offset and returns that offset.
    pub fn push(&mut self, bytes: &[u8]) -> u64 {
        let off = (self.len() as u64).next_multiple_of(ALIGN);
        match &mut self.sink {
            Sink::Memory(v) => {
                v.resize(off as usize, 0);
                v.extend_from_slice(bytes);
            }
            Sink::Object(w) => {
                let pad = [0u8; ALIGN as usize];
                let gap = (off - w.data_len()) as usize;
                if let Err(e) = w.write(&pad[..gap]).and_then(|()| w.write(bytes)) {
                    if self.error.is_none() {
                        self.error = Some(w.error(e));
                    }
                }
            }
            Sink::Finished(_) => unreachable!("weights pushed after their object was finished"),
        }
        off
    }

    /// The first error writing a streamed blob, if any.
    pub fn check(&mut self) -> Result<()> {
        match self.error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// The bytes, for the consumers that read them from memory.
    pub fn bytes(&self) -> Result<&[u8]> {
        match &self.sink {
            Sink::Memory(v) => Ok(v),
            _ => Err(CodegenError::internal(
                "the weights were streamed into their object and are not in memory",
            )),
        }
    }

    /// Completes a streamed blob's object (None for a blob kept in memory).
    pub fn finish_object(&mut self) -> Result<Option<TempObject>> {
        self.check()?;
        let len = self.len() as u64;
        match std::mem::replace(&mut self.sink, Sink::Finished(len)) {
            Sink::Object(w) => w.finish().map(Some),
            other => {
                self.sink = other;
                Ok(None)
            }
        }
    }
}

/// Blobs in memory compare by their bytes; a streamed blob equals no other.
impl PartialEq for Weights {
    fn eq(&self, other: &Weights) -> bool {
        match (&self.sink, &other.sink) {
            (Sink::Memory(a), Sink::Memory(b)) => a == b,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::Arch;

    /// Streamed or in memory, the blob has the same bytes at the same offsets.
    #[test]
    fn a_streamed_blob_is_the_object_of_the_same_blob_in_memory() {
        let pieces: [&[u8]; 4] = [&[1; 10], &[2; 64], &[], &[3; 100]];
        let mut mem = Weights::in_memory();
        let mut streamed = Weights::streamed(ObjectWriter::create(Arch::X86_64, "m_kiln_weights").unwrap());
        for p in pieces {
            assert_eq!(mem.push(p), streamed.push(p));
        }
        assert_eq!(mem.len(), streamed.len());
        let obj = streamed
            .finish_object()
            .unwrap()
            .expect("a streamed blob has an object");
        assert_eq!(
            streamed.len(),
            mem.len(),
            "the length outlives the object's writer"
        );
        let mut want = vec![];
        crate::weights_object::write(&mut want, Arch::X86_64, "m_kiln_weights", mem.bytes().unwrap())
            .unwrap();
        let got = std::fs::read(&obj.path).unwrap();
        assert_eq!(got, want);
        assert_eq!(obj.len, want.len() as u64);
        assert!(mem.finish_object().unwrap().is_none());
        assert!(streamed.bytes().is_err());
    }

    #[test]
    fn an_empty_streamed_blob_still_defines_its_symbol() {
        let mut streamed = Weights::streamed(ObjectWriter::create(Arch::Aarch64, "e_kiln_weights").unwrap());
        let obj = streamed.finish_object().unwrap().unwrap();
        let mut want = vec![];
        crate::weights_object::write(&mut want, Arch::Aarch64, "e_kiln_weights", &[]).unwrap();
        assert_eq!(std::fs::read(&obj.path).unwrap(), want);
    }
}
