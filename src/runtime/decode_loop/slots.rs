//! The conversation slots the decode loop owns, and which free slot a
//! request without a named slot gets.
//!
//! Taking a free slot for a prompt is worth, in positions:
//!
//! - **reuse**: the positions the slot has computed that the prompt starts
//!   with (the common prefix of its history and the prompt, at most the
//!   slot's computed positions, and never the prompt's last token, which is
//!   always computed for its logits) — work saved now;
//! - **loss**: the computed positions the slot holds beyond that prefix —
//!   another conversation's history, thrown away (or moved to the prompt
//!   cache) when the slot is overwritten, and recomputed when that
//!   conversation comes back.
//!
//! The request takes the free slot with the largest `reuse - loss`, the
//! least recently used one on a tie (then the lowest index). So a client
//! resending its growing conversation lands on its own history (large
//! reuse, no loss); a prompt that shares only a template header with a long
//! history (reuse 2, loss in the hundreds) takes an empty slot (0) instead;
//! and when every slot holds someone else's history, the one with the least
//! to lose goes. Positions a request can copy from another slot or the
//! prompt cache are not counted: they are there for whichever slot it takes.

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

    /// Positions of the history in the sequence state (a reply's last token
    /// is in the history before it is computed).
    pub fn computed(&self) -> usize {
        self.session
            .as_ref()
            .map_or(0, |s| s.kv.len().min(s.tokens.len()))
    }
}

/// Length of the common prefix of two token lists.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// What taking `slot` for `prompt` is worth (module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Worth {
    pub reuse: usize,
    pub loss: usize,
}

impl Worth {
    pub fn of(slot: &Slot, prompt: &[u32]) -> Self {
        let computed = slot.computed();
        let shared = common_prefix(slot.tokens(), prompt)
            .min(computed)
            .min(prompt.len().saturating_sub(1));
        // A recurrent state goes back only as far as a checkpoint.
        let reuse = slot
            .session
            .as_ref()
            .map_or(shared, |s| s.kv.restorable(shared).min(shared));
        Self {
            reuse,
            loss: computed - reuse,
        }
    }

    fn value(self) -> i64 {
        self.reuse as i64 - self.loss as i64
    }
}

/// The free slot for `prompt` (module documentation).
pub fn choose_free(slots: &[Slot], prompt: &[u32]) -> Option<usize> {
    slots
        .iter()
        .enumerate()
        .filter(|(_, s)| s.owner.is_none() && s.session.is_some())
        .min_by_key(|(_, s)| (std::cmp::Reverse(Worth::of(s, prompt).value()), s.last_used))
        .map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::test_state::computed;

    /// A free slot holding `tokens`, all computed but a reply's last one
    /// when `pending`.
    fn slot(tokens: &[u32], pending: bool, last_used: u64) -> Slot {
        let done = tokens.len() - usize::from(pending && !tokens.is_empty());
        let mut s = Session::new(Box::new(computed(&tokens[..done])));
        s.tokens = tokens.to_vec();
        Slot {
            session: Some(s),
            owner: None,
            last_used,
        }
    }

    const HEADER: [u32; 2] = [2, 10];

    fn conversation(seed: u32, len: usize) -> Vec<u32> {
        let mut t = HEADER.to_vec();
        t.extend((0..len as u32).map(|i| 100 + (seed * 7 + i) % 900));
        t
    }

    #[test]
    fn a_header_match_does_not_evict_a_long_history_while_a_slot_is_empty() {
        let long = conversation(1, 862);
        let slots = [slot(&long, true, 1), slot(&[], false, 0), slot(&[], false, 0)];
        let mut hello = HEADER.to_vec();
        hello.extend([300, 301, 302]);
        let w = Worth::of(&slots[0], &hello);
        assert_eq!((w.reuse, w.loss), (2, 861));
        assert_eq!(choose_free(&slots, &hello), Some(1));
        // Its own next turn goes back to it.
        let mut next = long.clone();
        next.extend([400, 401]);
        assert_eq!(choose_free(&slots, &next), Some(0));
        assert_eq!(Worth::of(&slots[0], &next).loss, 0);
    }

    #[test]
    fn with_every_slot_taken_the_one_with_least_to_lose_goes() {
        let slots = [
            slot(&conversation(1, 500), false, 1),
            slot(&conversation(2, 40), false, 3),
            slot(&conversation(3, 300), false, 2),
        ];
        let stranger = conversation(9, 20);
        assert_eq!(choose_free(&slots, &stranger), Some(1));
        // A prompt sharing a large part of a history beats a short history.
        let mut shared = conversation(1, 500)[..400].to_vec();
        shared.push(7);
        assert_eq!(choose_free(&slots, &shared), Some(0));
    }

    #[test]
    fn ties_go_to_the_least_recently_used_and_busy_slots_are_skipped() {
        let mut slots = [slot(&[], false, 5), slot(&[], false, 2), slot(&[], false, 9)];
        let p = [1, 2, 3];
        assert_eq!(choose_free(&slots, &p), Some(1));
        slots[1].owner = Some(7);
        assert_eq!(choose_free(&slots, &p), Some(0));
        slots[0].session = None;
        assert_eq!(choose_free(&slots, &p), Some(2));
        slots[2].owner = Some(8);
        assert_eq!(choose_free(&slots, &p), None);
    }

    #[test]
    fn the_prompts_last_token_and_uncomputed_positions_are_not_reuse() {
        let t = conversation(4, 30);
        // The whole prompt is held: its last token is still computed.
        let s = slot(&t, false, 1);
        assert_eq!(Worth::of(&s, &t).reuse, t.len() - 1);
        // A reply's last token is held but not computed.
        let s = slot(&t, true, 1);
        let mut more = t.clone();
        more.push(5);
        assert_eq!(
            Worth::of(&s, &more),
            Worth {
                reuse: t.len() - 1,
                loss: 0
            }
        );
    }
}
