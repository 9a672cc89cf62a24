//! A model in one GGUF file or split across shards named
//! `name-00001-of-00003.gguf` (what llama.cpp's converter and `gguf-split`
//! write): the shards are found from any one of them, checked against their
//! `split.*` metadata, and every tensor resolved to its shard and absolute
//! byte range.

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use super::GgufError;
use super::file::GgufFile;
use super::header::TensorInfo;
use super::metadata::{Metadata, optional};

/// 0-based index of this shard (u16 as written).
pub const SPLIT_NO: &str = "split.no";
/// Number of shards (u16 as written).
pub const SPLIT_COUNT: &str = "split.count";
/// Tensors across all shards (i32 as written).
pub const SPLIT_TENSORS: &str = "split.tensors.count";

/// Where one tensor's data is.
#[derive(Clone, Copy, Debug)]
pub struct TensorLoc<'a> {
    /// Index into [`GgufModel::shards`].
    pub shard: usize,
    pub path: &'a Path,
    pub info: &'a TensorInfo,
}

impl TensorLoc<'_> {
    /// Absolute byte range in the shard's file.
    pub fn range(&self) -> Range<u64> {
        self.info.data.clone()
    }
}

/// `prefix`, 1-based shard number and shard count of a file named
/// `prefix-NNNNN-of-MMMMM.gguf` (five digits each), else `None`.
pub fn split_name(path: &Path) -> Option<(String, u32, u32)> {
    let name = path.file_name()?.to_str()?;
    let stem = name.strip_suffix(".gguf")?;
    let (rest, count) = stem.rsplit_once("-of-")?;
    let (prefix, no) = rest.rsplit_once('-')?;
    let five = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    if !five(no) || !five(count) || prefix.is_empty() {
        return None;
    }
    let (no, count) = (no.parse().ok()?, count.parse().ok()?);
    (1..=count).contains(&no).then(|| (prefix.to_string(), no, count))
}

/// The name of shard `no` (1-based) of `count` next to `path`'s prefix.
pub fn shard_path(dir: &Path, prefix: &str, no: u32, count: u32) -> PathBuf {
    dir.join(format!("{prefix}-{no:05}-of-{count:05}.gguf"))
}

/// A GGUF model: one file, or every shard of a split one.
#[derive(Debug)]
pub struct GgufModel {
    shards: Vec<GgufFile>,
    /// Tensor name to (shard, index in that shard's tensor list).
    index: HashMap<String, (usize, usize)>,
}

impl GgufModel {
    /// Opens `path`; when it is one shard of a split model, opens every
    /// shard and checks that they belong together.
    pub fn open(path: &Path) -> Result<Self, GgufError> {
        let Some((prefix, _, count)) = split_name(path) else {
            let file = GgufFile::open(path)?;
            if let Some(n) = optional(file.metadata().get_count(SPLIT_COUNT)).map_err(|e| e.in_file(path))?
                && n > 1
            {
                return Err(GgufError::Split {
                    path: path.to_path_buf(),
                    reason: format!(
                        "{SPLIT_COUNT} is {n} but the file name does not end in -NNNNN-of-{n:05}.gguf, so its other shards cannot be found"
                    ),
                });
            }
            return Self::from_shards(vec![file]);
        };
        let dir = path.parent().unwrap_or(Path::new("."));
        let mut shards = Vec::new();
        for no in 1..=count {
            let p = shard_path(dir, &prefix, no, count);
            if !p.is_file() {
                return Err(GgufError::Split {
                    path: p,
                    reason: format!("shard {no} of {count} is missing"),
                });
            }
            let file = GgufFile::open(&p)?;
            check_shard(&file, no, count)?;
            shards.push(file);
        }
        Self::from_shards(shards)
    }

    fn from_shards(shards: Vec<GgufFile>) -> Result<Self, GgufError> {
        let mut index: HashMap<String, (usize, usize)> = HashMap::new();
        for (s, file) in shards.iter().enumerate() {
            for (i, t) in file.gguf().tensors.iter().enumerate() {
                if let Some(&(first, _)) = index.get(&t.name) {
                    return Err(GgufError::TensorInTwoShards {
                        tensor: t.name.clone(),
                        first: shards[first].path().to_path_buf(),
                        second: file.path().to_path_buf(),
                    });
                }
                index.insert(t.name.clone(), (s, i));
            }
        }
        let model = Self { shards, index };
        for file in &model.shards {
            let declared =
                optional(file.metadata().get_count(SPLIT_TENSORS)).map_err(|e| e.in_file(file.path()))?;
            if let Some(n) = declared
                && n != model.index.len()
            {
                return Err(GgufError::Split {
                    path: file.path().to_path_buf(),
                    reason: format!(
                        "{SPLIT_TENSORS} is {n} but the shards hold {} tensors",
                        model.index.len()
                    ),
                });
            }
        }
        Ok(model)
    }

    /// The shards in order (one for an unsplit file).
    pub fn shards(&self) -> &[GgufFile] {
        &self.shards
    }

    /// The model's metadata: the first shard's (later shards carry only
    /// their `split.*` keys).
    pub fn metadata(&self) -> &Metadata {
        // A model always has at least one shard.
        self.shards[0].metadata()
    }

    /// `general.architecture`: llama.cpp's name of the model family.
    pub fn architecture(&self) -> Result<&str, GgufError> {
        self.metadata().get_str("general.architecture")
    }

    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    pub fn has(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    pub fn tensor(&self, name: &str) -> Result<TensorLoc<'_>, GgufError> {
        self.index
            .get(name)
            .and_then(|&(s, i)| self.loc(s, i))
            .ok_or_else(|| GgufError::MissingTensor {
                tensor: name.to_string(),
            })
    }

    fn loc(&self, shard: usize, i: usize) -> Option<TensorLoc<'_>> {
        let file = self.shards.get(shard)?;
        Some(TensorLoc {
            shard,
            path: file.path(),
            info: file.gguf().tensors.get(i)?,
        })
    }

    /// Every tensor, shard by shard in file order.
    pub fn tensors(&self) -> impl Iterator<Item = TensorLoc<'_>> {
        self.shards.iter().enumerate().flat_map(|(s, f)| {
            f.gguf().tensors.iter().map(move |info| TensorLoc {
                shard: s,
                path: f.path(),
                info,
            })
        })
    }

    pub fn tensor_bytes(&self, name: &str) -> Result<&[u8], GgufError> {
        let loc = self.tensor(name)?;
        Ok(self.shards[loc.shard].data(loc.info))
    }
}

/// Shard `no` (1-based) of `count` must say so in its own metadata.
fn check_shard(file: &GgufFile, no: u32, count: u32) -> Result<(), GgufError> {
    let path = file.path();
    let m = file.metadata();
    let split = |reason: String| GgufError::Split {
        path: path.to_path_buf(),
        reason,
    };
    let read = |key| optional(m.get_count(key)).map_err(|e| e.in_file(path));
    match (read(SPLIT_NO)?, read(SPLIT_COUNT)?) {
        (Some(n), Some(c)) if n as u64 == (no - 1) as u64 && c as u64 == count as u64 => Ok(()),
        (None, None) if count == 1 => Ok(()),
        (n, c) => Err(split(format!(
            "the name says shard {no} of {count}, the metadata {SPLIT_NO} {} and {SPLIT_COUNT} {} (expected {} and {count})",
            n.map_or("missing".into(), |v| v.to_string()),
            c.map_or("missing".into(), |v| v.to_string()),
            no - 1
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_names() {
        let p = Path::new("/m/olmoe-q8-00002-of-00003.gguf");
        assert_eq!(split_name(p), Some(("olmoe-q8".into(), 2, 3)));
        assert_eq!(
            shard_path(Path::new("/m"), "olmoe-q8", 3, 3),
            Path::new("/m/olmoe-q8-00003-of-00003.gguf")
        );
        for not in [
            "olmoe.gguf",
            "a-00004-of-00003.gguf",
            "a-00000-of-00003.gguf",
            "a-0001-of-00003.gguf",
            "-00001-of-00003.gguf",
            "a-00001-of-00003.safetensors",
            "a-0000x-of-00003.gguf",
        ] {
            assert_eq!(split_name(Path::new(not)), None, "{not}");
        }
    }
}
