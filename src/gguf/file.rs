//! One GGUF file on disk: mapped, parsed and validated at open.

use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use super::GgufError;
use super::header::{Gguf, TensorInfo, parse};
use super::metadata::Metadata;

/// A mapped GGUF file whose header has been validated completely, so every
/// tensor's bytes can be handed out without further checks.
#[derive(Debug)]
pub struct GgufFile {
    path: PathBuf,
    map: Mmap,
    gguf: Gguf,
}

impl GgufFile {
    pub fn open(path: &Path) -> Result<Self, GgufError> {
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        // SAFETY: the map is read-only and model files are treated as
        // immutable while the engine runs; every access is bounds-checked
        // against the length parsed here. A file truncated by another
        // process while mapped would fault (SIGBUS), the documented
        // limitation of mapping files (as for safetensors checkpoints).
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        let gguf = parse(&map).map_err(|e| e.in_file(path))?;
        Ok(Self {
            path: path.to_path_buf(),
            map,
            gguf,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn gguf(&self) -> &Gguf {
        &self.gguf
    }

    pub fn metadata(&self) -> &Metadata {
        &self.gguf.metadata
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// The data of `info`, a tensor of this file.
    pub fn data(&self, info: &TensorInfo) -> &[u8] {
        let r = info.data.start as usize..info.data.end as usize;
        self.map.get(r).unwrap_or_default()
    }

    pub fn tensor_bytes(&self, name: &str) -> Result<&[u8], GgufError> {
        let info = self.gguf.tensor(name).ok_or_else(|| GgufError::MissingTensor {
            tensor: name.to_string(),
        })?;
        Ok(self.data(info))
    }
}
