//! A bounds-checked little-endian reader over the bytes of one file.
//!
//! Every read names what it was reading, so a truncated file is refused
//! with "truncated at offset N: the type of key K needs 4 bytes, 1 left"
//! rather than a bare end-of-file.

use super::GgufError;

pub(crate) struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    pub fn pos(&self) -> u64 {
        self.pos as u64
    }

    pub fn left(&self) -> u64 {
        (self.buf.len() - self.pos.min(self.buf.len())) as u64
    }

    /// The next `n` bytes; `what` names them in the error.
    pub fn bytes(&mut self, n: u64, what: impl FnOnce() -> String) -> Result<&'a [u8], GgufError> {
        let left = self.left();
        let slice = usize::try_from(n)
            .ok()
            .filter(|_| n <= left)
            .and_then(|n| self.buf.get(self.pos..self.pos + n));
        match slice {
            Some(s) => {
                self.pos += s.len();
                Ok(s)
            }
            None => Err(GgufError::Truncated {
                offset: self.pos(),
                what: what(),
                need: n,
                left,
            }),
        }
    }

    pub fn array<const N: usize>(&mut self, what: impl FnOnce() -> String) -> Result<[u8; N], GgufError> {
        let b = self.bytes(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(b);
        Ok(a)
    }

    pub fn u32(&mut self, what: impl FnOnce() -> String) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    pub fn u64(&mut self, what: impl FnOnce() -> String) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// Refuses `count` entries of at least `min` bytes each that cannot fit
    /// in what is left: the check that comes before any allocation sized
    /// by a count read from the file.
    pub fn check_count(&self, what: impl FnOnce() -> String, count: u64, min: u64) -> Result<(), GgufError> {
        match count.checked_mul(min) {
            Some(need) if need <= self.left() => Ok(()),
            _ => Err(GgufError::Count {
                what: what(),
                count,
                offset: self.pos(),
                left: self.left(),
                min,
            }),
        }
    }
}
