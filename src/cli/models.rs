//! `coli list` and `coli rm`: the models directory (see [`crate::catalog`]).

use std::io::Write;

use clap::Args;
use serde::Serialize;

use super::output::diag;
use crate::catalog::{self, Entry, ModelsDir, bundled};

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Memory for the whole engine in GB that "fits" is judged against
    /// (default: 90% of the headroom, as the engine budgets it).
    #[arg(long, allow_negative_numbers = true)]
    pub ram_gb: Option<f64>,
    /// Print the list as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct RmArgs {
    /// Names of models in the models directory (as `coli list` shows them).
    #[arg(required = true, value_name = "NAME")]
    pub names: Vec<String>,
}

/// One row of `coli list --json`.
#[derive(Debug, Serialize)]
struct Row {
    name: String,
    path: String,
    bundled: bool,
    family: Option<String>,
    formats: Option<String>,
    size_bytes: u64,
    placement: Option<super::fit::Placement>,
    fits: String,
    error: Option<String>,
}

/// The memory budget "fits" is judged against, and where it came from.
fn budget(ram_gb: Option<f64>) -> anyhow::Result<Option<u64>> {
    match ram_gb {
        Some(g) if !(g.is_finite() && g > 0.0) => Err(super::usage(format!(
            "--ram-gb must be a positive number, got {g}"
        ))),
        Some(g) => Ok(Some((g * (1u64 << 30) as f64) as u64)),
        None => Ok(colibri_actors::cache::memory_headroom().map(|h| h.bytes / 10 * 9)),
    }
}

fn row(e: &Entry, budget: Option<u64>) -> Row {
    let error = e.family.as_ref().err().or(e.formats.as_ref().err()).cloned();
    let fit = match (budget, error.is_none() && e.path.exists()) {
        (Some(b), true) => {
            Some(super::fit::fit_dir(&e.path, b, None).map_err(|err| super::error_chain(&err)))
        }
        _ => None,
    };
    let (placement, fits, error) = match fit {
        Some(Ok(f)) => (Some(f.placement), f.summary(), error),
        Some(Err(why)) => (None, "?".to_string(), Some(why)),
        None if budget.is_none() => (None, "? (no memory limit readable)".to_string(), error),
        None if e.bundled && error.is_none() => (
            Some(super::fit::Placement::Mapped),
            "yes, all in RAM".to_string(),
            None,
        ),
        None => (None, "?".to_string(), error),
    };
    Row {
        name: e.name.clone(),
        path: e.path.display().to_string(),
        bundled: e.bundled,
        family: e.family.as_ref().ok().cloned(),
        formats: e.formats.as_ref().ok().map(ToString::to_string),
        size_bytes: e.size_bytes,
        placement,
        fits,
        error,
    }
}

fn human(bytes: u64) -> String {
    let b = bytes as f64;
    if b >= 1e9 {
        format!("{:.1} GB", b / 1e9)
    } else if b >= 1e6 {
        format!("{:.1} MB", b / 1e6)
    } else {
        format!("{:.0} kB", b / 1e3)
    }
}

pub fn list(args: ListArgs) -> anyhow::Result<()> {
    let models = ModelsDir::from_env()?;
    let budget = budget(args.ram_gb)?;
    let rows: Vec<Row> = catalog::list(&models)?.iter().map(|e| row(e, budget)).collect();
    let mut out = super::output::stdout();
    if args.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&rows)?)?;
        return Ok(());
    }
    let table: Vec<[String; 5]> = rows
        .iter()
        .map(|r| {
            [
                if r.bundled {
                    format!("{} (bundled)", r.name)
                } else {
                    r.name.clone()
                },
                r.family.clone().unwrap_or_else(|| "?".into()),
                r.formats.clone().unwrap_or_else(|| "?".into()),
                human(r.size_bytes),
                match &r.error {
                    Some(e) => format!("{} (error: {e})", r.fits),
                    None => r.fits.clone(),
                },
            ]
        })
        .collect();
    let head = ["NAME", "FAMILY", "FORMATS", "SIZE", "FITS"];
    let mut width = head.map(str::len);
    for r in &table {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: [&str; 5]| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 < cells.len() {
                s.push_str(&format!("{c:<w$}  ", w = width[i]));
            } else {
                s.push_str(c);
            }
        }
        s
    };
    writeln!(out, "{}", line(head))?;
    for r in &table {
        writeln!(out, "{}", line([&r[0], &r[1], &r[2], &r[3], &r[4]]))?;
    }
    writeln!(
        out,
        "models directory: {} (COLI_MODELS to change it)",
        models.root().display()
    )?;
    Ok(())
}

pub fn rm(args: RmArgs) -> anyhow::Result<()> {
    let models = ModelsDir::from_env()?;
    for name in &args.names {
        if !catalog::is_name(name) {
            return Err(super::usage(format!(
                "coli rm takes model names from `coli list`, not paths: {name:?}"
            )));
        }
        let dir = models.path_of(name)?;
        if !dir.join("config.json").is_file() {
            anyhow::bail!(
                "no model {name:?} in the models directory {}",
                models.root().display()
            );
        }
        let bytes = catalog::dir_size(&dir);
        std::fs::remove_dir_all(&dir).map_err(|e| anyhow::anyhow!("removing {}: {e}", dir.display()))?;
        let again = if name == bundled::NAME {
            " (the bundled model is written out again when next used)"
        } else {
            ""
        };
        diag!("removed {name} ({}, {}){again}", dir.display(), human(bytes));
    }
    Ok(())
}
