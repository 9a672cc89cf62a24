//! The bundled chat model, embedded in the binary.
//!
//! `cargo install` copies only the binary, so a `coli` that looked for the
//! model at the source path compiled into it broke as soon as the clone
//! moved. The model's files (a few MB) are therefore part of the binary and
//! written out, once, as `colibri-tiny` in the models directory, where the
//! engine maps them like any other model. A binary still inside its source
//! tree's `target/` (`cargo run`, the tests) uses the tree's copy instead
//! and writes nothing.

use std::path::{Path, PathBuf};

use super::{CatalogError, ModelsDir, io_err};

/// The bundled model's name in the models directory and for `--model`.
pub const NAME: &str = "colibri-tiny";

/// The model's files, as the repository holds them in `models/colibri-tiny`.
const FILES: [(&str, &[u8]); 8] = [
    (
        "config.json",
        include_bytes!("../../models/colibri-tiny/config.json"),
    ),
    (
        "generation_config.json",
        include_bytes!("../../models/colibri-tiny/generation_config.json"),
    ),
    (
        "model.safetensors",
        include_bytes!("../../models/colibri-tiny/model.safetensors"),
    ),
    (
        "tokenizer.json",
        include_bytes!("../../models/colibri-tiny/tokenizer.json"),
    ),
    (
        "tokenizer_config.json",
        include_bytes!("../../models/colibri-tiny/tokenizer_config.json"),
    ),
    ("REF.json", include_bytes!("../../models/colibri-tiny/REF.json")),
    (
        "TRAINING.json",
        include_bytes!("../../models/colibri-tiny/TRAINING.json"),
    ),
    (
        "LICENSE-WordNet.txt",
        include_bytes!("../../models/colibri-tiny/LICENSE-WordNet.txt"),
    ),
];

/// The source tree's copy of the model.
pub fn source_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("models")
        .join(NAME)
}

/// True when the running binary was built in, and still sits in, the source
/// tree it was compiled from.
fn running_from_source_tree() -> bool {
    let (Ok(exe), Ok(tree)) = (
        std::env::current_exe().and_then(|p| p.canonicalize()),
        Path::new(env!("CARGO_MANIFEST_DIR")).canonicalize(),
    ) else {
        return false;
    };
    exe.starts_with(tree.join("target")) && source_dir().join("config.json").is_file()
}

/// Where the bundled model is: the source tree's copy for a binary in its
/// tree, else the copy in the models directory, written (or rewritten,
/// when it differs from the embedded files) first.
pub fn dir() -> Result<PathBuf, CatalogError> {
    if running_from_source_tree() {
        return Ok(source_dir());
    }
    install(&ModelsDir::from_env()?)
}

/// Where [`dir`] would find the model, without writing anything: for
/// `coli list`. `None` when it is not written out yet.
pub fn existing_dir() -> Option<PathBuf> {
    if running_from_source_tree() {
        return Some(source_dir());
    }
    let d = ModelsDir::from_env().ok()?.root().join(NAME);
    matches(&d).then_some(d)
}

/// Bytes the embedded model takes.
pub fn size() -> u64 {
    FILES.iter().map(|(_, b)| b.len() as u64).sum()
}

/// True when `dir` holds exactly the embedded files (extra files allowed).
fn matches(dir: &Path) -> bool {
    FILES.iter().all(|(name, bytes)| {
        let p = dir.join(name);
        std::fs::metadata(&p).is_ok_and(|m| m.len() == bytes.len() as u64)
            && std::fs::read(&p).is_ok_and(|b| b == *bytes)
    })
}

/// Writes the embedded model as `NAME` in `models` unless an identical copy
/// is there. The files go to a hidden temporary directory first and are
/// renamed into place, so a reader never sees half a model and two
/// processes starting at once both end with a whole one.
pub fn install(models: &ModelsDir) -> Result<PathBuf, CatalogError> {
    let dest = models.root().join(NAME);
    if matches(&dest) {
        return Ok(dest);
    }
    models.create()?;
    let pid = std::process::id();
    let tmp = models.root().join(format!(".{NAME}.tmp-{pid}"));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(io_err("removing", &tmp))?;
    }
    std::fs::create_dir(&tmp).map_err(io_err("creating", &tmp))?;
    let written = FILES.iter().try_for_each(|(name, bytes)| {
        let p = tmp.join(name);
        std::fs::write(&p, bytes).map_err(io_err("writing", &p))
    });
    if let Err(e) = written {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    // An outdated copy (an older binary's model) is moved aside, not
    // deleted, until the new one is in place.
    let old = models.root().join(format!(".{NAME}.old-{pid}"));
    let moved_old = dest.exists() && std::fs::rename(&dest, &old).is_ok();
    let placed = std::fs::rename(&tmp, &dest);
    if moved_old {
        let _ = std::fs::remove_dir_all(&old);
    }
    match placed {
        Ok(()) => Ok(dest),
        Err(e) => {
            let _ = std::fs::remove_dir_all(&tmp);
            // Another process placed its copy between the check and the rename.
            if matches(&dest) {
                Ok(dest)
            } else {
                Err(io_err("placing the bundled model at", &dest)(e))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_files_are_the_source_trees() {
        assert!(matches(&source_dir()));
    }

    #[test]
    fn install_writes_once_and_repairs_a_changed_copy() {
        let tmp = tempfile::tempdir().expect("tmp");
        let models = ModelsDir::at(tmp.path().join("m"));
        let d = install(&models).expect("install");
        assert_eq!(d, models.root().join(NAME));
        assert!(matches(&d));
        let cfg = d.join("config.json");
        let t0 = std::fs::metadata(&cfg).and_then(|m| m.modified()).expect("mtime");
        assert_eq!(install(&models).expect("again"), d);
        let t1 = std::fs::metadata(&cfg).and_then(|m| m.modified()).expect("mtime");
        assert_eq!(t0, t1, "an identical copy is left alone");
        std::fs::write(d.join("model.safetensors"), b"truncated").expect("break it");
        install(&models).expect("repair");
        assert!(matches(&d));
        let leftovers: Vec<_> = std::fs::read_dir(models.root())
            .expect("ls")
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(leftovers, vec![std::ffi::OsString::from(NAME)]);
    }
}
