//! The context a slot holds (`--ctx`), chosen before anything else is
//! budgeted because the KV cache is budgeted at full context for every
//! slot: by default the model's `max_position_embeddings`, held back to
//! what the memory budget leaves the KV cache; an explicit `--ctx` is
//! taken as given or refused, never quietly shortened.

use crate::model::kv_cache::KvTypes;

/// The default context never drops below this (or the model's own, when
/// shorter) because of the budget: a shorter one serves no conversation,
/// and a budget that tight is reported by the memory plan's own checks.
pub const MIN_DEFAULT_CTX: usize = 256;

/// Why an explicit `--ctx` was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ContextError {
    /// More positions than the model runs.
    #[error("--ctx {requested} exceeds the model's {limit} positions{}", scaled_note(*.declared, *.limit))]
    TooLong {
        requested: usize,
        /// `max_position_embeddings`.
        declared: usize,
        /// What a declared RoPE scaling extends it to (else `declared`).
        limit: usize,
    },
    /// The KV cache of that many positions does not fit the budget.
    #[error(
        "--ctx {requested} does not fit the memory budget: the KV cache of {slots} slot(s) at {kv} holds at most {fits} positions in the {} left after the dense weights, the working set and the least expert cache (ask for --ctx {fits} or less, fewer --kv-slots, a smaller --kv-type or more --ram-gb)",
        size(*.room)
    )]
    DoesNotFit {
        requested: usize,
        fits: usize,
        slots: usize,
        kv: KvTypes,
        room: u64,
    },
}

fn scaled_note(declared: usize, limit: usize) -> String {
    if limit > declared {
        format!(" (max_position_embeddings {declared}, extended by its rope_scaling)")
    } else {
        " (max_position_embeddings; a rope_scaling the config declares may extend it)".to_string()
    }
}

/// Bytes as GiB with one decimal, or MiB below 1 GiB (where 0.0 GiB
/// would say nothing).
fn size(b: u64) -> String {
    if b >= 1 << 30 {
        format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
    }
}

/// What the context is chosen from.
#[derive(Clone, Copy, Debug)]
pub struct ContextRequest {
    /// `--ctx`, when given.
    pub requested: Option<usize>,
    /// The model's `max_position_embeddings`: the default.
    pub declared: usize,
    /// The most an explicit `--ctx` may ask for ([`crate::model::family::ModelConfig::position_limit`]).
    pub limit: usize,
    pub slots: usize,
    pub kv: KvTypes,
}

/// The memory side: `fits(ctx)` says whether everything the engine holds
/// with a KV cache of `ctx` positions per slot fits the budget; `room` is
/// what the budget leaves the KV cache (and the prompt cache, when on)
/// after the dense weights, the working set and the least expert cache.
pub struct ContextBudget<'a> {
    pub room: u64,
    pub fits: &'a dyn Fn(usize) -> bool,
    /// Bytes the KV cache of every slot takes at a context: the default
    /// context gives it at most half of `room` ([`DEFAULT_KV_SHARE`]).
    pub kv_bytes: &'a dyn Fn(usize) -> u64,
}

/// The share of the room a default context's KV cache may take: the rest
/// stays for the expert cache, which decides streamed decode speed. An
/// explicit `--ctx` may take all of it.
pub const DEFAULT_KV_SHARE: (u64, u64) = (1, 2);

/// The chosen context.
#[derive(Clone, Debug, PartialEq)]
pub struct ContextChoice {
    pub ctx: usize,
    /// When the budget held the default below the model's positions: the
    /// sentence that says so (the front ends print it on stderr).
    pub capped: Option<String>,
}

/// The longest context in `0..=max` that `fits` (which must be monotone:
/// a context that fits means every shorter one does).
pub fn longest_fitting(max: usize, fits: &dyn Fn(usize) -> bool) -> usize {
    if fits(max) {
        return max;
    }
    let (mut lo, mut hi) = (0usize, max);
    // fits(lo) holds (0 positions always do, by definition) and fits(hi) does not.
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) { lo = mid } else { hi = mid }
    }
    lo
}

/// The context for `req` under `budget` (`None`: no budget, nothing caps).
pub fn choose_context(
    req: &ContextRequest,
    budget: Option<&ContextBudget>,
) -> Result<ContextChoice, ContextError> {
    let slots = req.slots.max(1);
    let limit = req.limit.max(req.declared);
    if let Some(n) = req.requested {
        if n > limit {
            return Err(ContextError::TooLong {
                requested: n,
                declared: req.declared,
                limit,
            });
        }
        // Refused only when the context is what runs out: when not even one
        // position fits, the memory plan's own checks say what does not.
        if let Some(b) = budget
            && !(b.fits)(n)
            && (b.fits)(1)
        {
            return Err(ContextError::DoesNotFit {
                requested: n,
                fits: longest_fitting(n, b.fits),
                slots,
                kv: req.kv,
                room: b.room,
            });
        }
        return Ok(ContextChoice { ctx: n, capped: None });
    }
    let declared = req.declared.max(1);
    let Some(b) = budget else {
        return Ok(ContextChoice {
            ctx: declared,
            capped: None,
        });
    };
    let (num, den) = DEFAULT_KV_SHARE;
    let share = b.room / den * num;
    let within = |c: usize| (b.fits)(c) && (b.kv_bytes)(c) <= share;
    let fits = longest_fitting(declared, &within);
    if fits == declared {
        return Ok(ContextChoice {
            ctx: declared,
            capped: None,
        });
    }
    let ctx = fits.max(MIN_DEFAULT_CTX.min(declared));
    let floor = if ctx > fits {
        format!("; {ctx} is the least the default takes")
    } else {
        String::new()
    };
    Ok(ContextChoice {
        ctx,
        capped: Some(format!(
            "context {ctx} of the model's {declared} positions: the KV cache of {slots} slot(s) at {} fits {fits} in half of the {} left, the other half kept for the expert cache{floor} (--ctx to choose, --kv-type for a smaller cache)",
            req.kv,
            size(b.room)
        )),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::kv_cache::KvType;

    fn req(requested: Option<usize>) -> ContextRequest {
        ContextRequest {
            requested,
            declared: 131_072,
            limit: 131_072,
            slots: 4,
            kv: KvTypes::both(KvType::F16),
        }
    }

    #[test]
    fn the_default_leaves_half_the_room_to_the_expert_cache_and_an_explicit_ctx_may_take_it() {
        let all = |_: usize| true;
        let kv = |c: usize| c as u64 * 1000;
        let b = ContextBudget {
            room: 100_000_000,
            fits: &all,
            kv_bytes: &kv,
        };
        let c = choose_context(&req(None), Some(&b)).unwrap();
        assert_eq!(c.ctx, 50_000);
        assert!(
            c.capped.as_deref().is_some_and(|m| m.contains("half of the")),
            "{c:?}"
        );
        assert_eq!(choose_context(&req(Some(90_000)), Some(&b)).unwrap().ctx, 90_000);
    }

    #[test]
    fn the_longest_fitting_context_is_found_exactly() {
        for cap in [0usize, 1, 2, 255, 4096, 32_767, 131_071, 131_072] {
            let fits = move |c: usize| c <= cap;
            assert_eq!(longest_fitting(131_072, &fits), cap.min(131_072));
        }
    }

    #[test]
    fn the_default_is_the_models_unless_the_budget_caps_it_and_says_so() {
        let all = |_: usize| true;
        let b = ContextBudget {
            room: 1 << 40,
            fits: &all,
            kv_bytes: &|_| 0,
        };
        assert_eq!(
            choose_context(&req(None), Some(&b)).unwrap(),
            ContextChoice {
                ctx: 131_072,
                capped: None
            }
        );
        assert_eq!(choose_context(&req(None), None).unwrap().ctx, 131_072);
        let some = |c: usize| c <= 32_768;
        let b = ContextBudget {
            room: 6 << 30,
            fits: &some,
            kv_bytes: &|_| 0,
        };
        let c = choose_context(&req(None), Some(&b)).unwrap();
        assert_eq!(c.ctx, 32_768);
        let note = c.capped.unwrap();
        assert!(
            note.starts_with("context 32768 of the model's 131072 positions: the KV cache of 4 slot(s) at f16 fits 32768 in half of the 6.0 GiB left, the other half kept for the expert cache ("),
            "{note}"
        );
        // Not below the floor: the plan's own checks report a budget that tight.
        let tiny = |c: usize| c <= 10;
        let b = ContextBudget {
            room: 1 << 20,
            fits: &tiny,
            kv_bytes: &|_| 0,
        };
        assert_eq!(choose_context(&req(None), Some(&b)).unwrap().ctx, MIN_DEFAULT_CTX);
    }

    #[test]
    fn an_explicit_context_is_taken_or_refused_with_both_numbers() {
        let some = |c: usize| c <= 32_768;
        let b = ContextBudget {
            room: 6 << 30,
            fits: &some,
            kv_bytes: &|_| 0,
        };
        assert_eq!(choose_context(&req(Some(32_768)), Some(&b)).unwrap().ctx, 32_768);
        let e = choose_context(&req(Some(40_000)), Some(&b)).unwrap_err();
        assert_eq!(
            e,
            ContextError::DoesNotFit {
                requested: 40_000,
                fits: 32_768,
                slots: 4,
                kv: KvTypes::both(KvType::F16),
                room: 6 << 30
            }
        );
        assert!(
            e.to_string().contains("--ctx 40000") && e.to_string().contains("32768"),
            "{e}"
        );
        let e = choose_context(&req(Some(200_000)), None).unwrap_err();
        assert!(
            e.to_string().contains("200000") && e.to_string().contains("131072"),
            "{e}"
        );
        // A declared scaling extends what may be asked for, not the default.
        let scaled = ContextRequest {
            declared: 40_960,
            ..req(Some(131_072))
        };
        assert_eq!(choose_context(&scaled, None).unwrap().ctx, 131_072);
        let e = choose_context(
            &ContextRequest {
                requested: Some(131_073),
                ..scaled
            },
            None,
        )
        .unwrap_err();
        assert!(e.to_string().contains("max_position_embeddings 40960"), "{e}");
        assert_eq!(
            choose_context(
                &ContextRequest {
                    requested: None,
                    ..scaled
                },
                None
            )
            .unwrap()
            .ctx,
            40_960
        );
        // Nothing fits at all: the context is not what runs out.
        let none = |_: usize| false;
        let b = ContextBudget {
            room: 0,
            fits: &none,
            kv_bytes: &|_| 0,
        };
        assert_eq!(choose_context(&req(Some(64)), Some(&b)).unwrap().ctx, 64);
    }
}
