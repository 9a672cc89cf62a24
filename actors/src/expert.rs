//! Experts as the runtime sees them: a key and the byte ranges that hold it.

use std::fmt;
use std::path::PathBuf;

use crate::error::SourceError;

/// One routed expert of one layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExpertKey {
    pub layer: u32,
    pub expert: u32,
}

impl ExpertKey {
    pub fn new(layer: u32, expert: u32) -> Self {
        Self { layer, expert }
    }
}

impl fmt::Display for ExpertKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "L{}/E{}", self.layer, self.expert)
    }
}

/// Index into [`ExpertMap::files`].
pub type FileId = u32;

/// A byte range of one file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    pub file: FileId,
    pub offset: u64,
    pub len: u64,
}

/// Where one expert's bytes live: an ordered list of pieces (its tensors and
/// their scales). Pieces that are adjacent in one file are read with a single
/// request; a container written by `coli convert` makes the whole expert one
/// read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExpertExtent {
    pub pieces: Vec<Piece>,
}

/// A contiguous read covering one or more pieces, and where each piece starts
/// in the delivered buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadSpan {
    pub file: FileId,
    pub offset: u64,
    pub len: u64,
}

impl ExpertExtent {
    /// Total payload bytes (what a miss costs on disk).
    pub fn bytes(&self) -> u64 {
        self.pieces.iter().map(|p| p.len).sum()
    }

    /// Groups the pieces into as few contiguous reads as possible. Gaps up to
    /// `max_gap` bytes (alignment padding) are read through rather than split.
    /// Returns the reads and, for each piece, its offset in the concatenation
    /// of the reads.
    pub fn plan_reads(&self, max_gap: u64) -> (Vec<ReadSpan>, Vec<usize>) {
        let mut spans: Vec<ReadSpan> = Vec::new();
        let mut piece_at = Vec::with_capacity(self.pieces.len());
        let mut buf_len: u64 = 0;
        for p in &self.pieces {
            let extend = spans.last().is_some_and(|s| {
                s.file == p.file && p.offset >= s.offset + s.len && p.offset - (s.offset + s.len) <= max_gap
            });
            if extend {
                if let Some(s) = spans.last_mut() {
                    let gap = p.offset - (s.offset + s.len);
                    buf_len += gap;
                    piece_at.push(buf_len as usize);
                    s.len += gap + p.len;
                    buf_len += p.len;
                }
            } else {
                piece_at.push(buf_len as usize);
                spans.push(ReadSpan {
                    file: p.file,
                    offset: p.offset,
                    len: p.len,
                });
                buf_len += p.len;
            }
        }
        (spans, piece_at)
    }
}

/// Every routed expert of a model: the files and each expert's extent.
#[derive(Clone, Debug, Default)]
pub struct ExpertMap {
    pub files: Vec<PathBuf>,
    pub layers: usize,
    pub experts_per_layer: usize,
    /// `extents[layer * experts_per_layer + expert]`; layers without routed
    /// experts hold empty extents.
    pub extents: Vec<ExpertExtent>,
}

impl ExpertMap {
    pub fn new(files: Vec<PathBuf>, layers: usize, experts_per_layer: usize) -> Self {
        Self {
            files,
            layers,
            experts_per_layer,
            extents: vec![ExpertExtent::default(); layers * experts_per_layer],
        }
    }

    fn index(&self, key: ExpertKey) -> Option<usize> {
        let (l, e) = (key.layer as usize, key.expert as usize);
        (l < self.layers && e < self.experts_per_layer).then_some(l * self.experts_per_layer + e)
    }

    pub fn extent(&self, key: ExpertKey) -> Result<&ExpertExtent, SourceError> {
        self.index(key)
            .map(|i| &self.extents[i])
            .filter(|e| !e.pieces.is_empty())
            .ok_or(SourceError::UnknownExpert { key })
    }

    pub fn set_extent(&mut self, key: ExpertKey, extent: ExpertExtent) -> Result<(), SourceError> {
        let i = self.index(key).ok_or(SourceError::UnknownExpert { key })?;
        self.extents[i] = extent;
        Ok(())
    }

    /// The largest single expert, for buffer and budget sizing.
    pub fn max_expert_bytes(&self) -> u64 {
        self.extents.iter().map(|e| e.bytes()).max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adjacent_pieces_merge_into_one_read() {
        let ext = ExpertExtent {
            pieces: vec![
                Piece {
                    file: 0,
                    offset: 100,
                    len: 10,
                },
                Piece {
                    file: 0,
                    offset: 110,
                    len: 5,
                },
                Piece {
                    file: 0,
                    offset: 120,
                    len: 5,
                },
                Piece {
                    file: 1,
                    offset: 0,
                    len: 3,
                },
            ],
        };
        let (spans, at) = ext.plan_reads(16);
        assert_eq!(spans.len(), 2);
        assert_eq!(
            spans[0],
            ReadSpan {
                file: 0,
                offset: 100,
                len: 25
            }
        );
        assert_eq!(at, vec![0, 10, 20, 25]);
        let (spans, at) = ext.plan_reads(0);
        assert_eq!(spans.len(), 3);
        assert_eq!(at, vec![0, 10, 15, 20]);
    }
}
