//! The yardsticks a streamed run is judged by, each computed so that the
//! run cannot beat it: the disk probe ([`disk`]), the bytes no cache of the
//! run's size could avoid (`crate::routing::replay::optimal`), and the
//! bounds built from them ([`io`], [`memory`]).

pub mod disk;
pub mod io;
pub mod memory;

pub use disk::{CacheTreatment, DiskError, DiskProbe, ProbeOptions, Repeat, probe, sim_bandwidth};
pub use io::{ComputeBound, DiskFigure, IoBound, mean_routed_expert_bytes};
pub use memory::{MemoryBound, memory_bandwidth};
