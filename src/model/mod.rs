//! Model families.
