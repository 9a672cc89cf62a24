//! Safetensors checkpoints and containers (filled in by the loader work).
