//! The conversation slots the decode loop owns, and which free slot a
//! request without a named slot gets.

use crate::engine::Session;
use crate::runtime::request::RequestId;

/// One conversation: its session (absent while lent to the compute actor
/// for a step) and the request running in it.
pub struct Slot {
    pub session: Option<Session>,
    pub owner: Option<RequestId>,
    /// Admission counter value when last used (least recently used choice).
    pub last_used: u64,
}

impl Slot {
    pub fn new(session: Session) -> Self {
        Self {
            session: Some(session),
            owner: None,
            last_used: 0,
        }
    }

    pub fn tokens(&self) -> &[u32] {
        self.session.as_ref().map_or(&[], |s| s.tokens.as_slice())
    }
}

/// Length of the common prefix of two token lists.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The free slot for `prompt`: the longest reusable prefix wins (so a
/// client resending a growing conversation lands on its own history), ties
/// go to the least recently used.
pub fn choose_free(slots: &[Slot], prompt: &[u32]) -> Option<usize> {
    slots
        .iter()
        .enumerate()
        .filter(|(_, s)| s.owner.is_none() && s.session.is_some())
        .max_by_key(|(_, s)| (common_prefix(s.tokens(), prompt), std::cmp::Reverse(s.last_used)))
        .map(|(i, _)| i)
}
