//! The rule states under one limiter key: a shared sliding log and one counter per
//! fixed-window or GCRA rule, evaluated and recorded by the pure functions of `algorithm`.

use std::collections::VecDeque;

use smallvec::SmallVec;

use crate::{
    algorithm::{self, FixedWindowState, RuleOutcome},
    rule::{Algorithm, Rule},
};

/// Every rule state under one limiter key: one entry, one look-up, whatever the rules.
#[derive(Default)]
pub(super) struct RuleStates {
    /// The instants of admitted units, oldest first, shared by the sliding-log rules.
    log: VecDeque<u64>,
    /// One per fixed-window or GCRA rule; inline for a limiter with one such rule.
    counters: SmallVec<[Counter; 1]>,
}

/// The state of one fixed-window or GCRA rule.
struct Counter {
    rule: Rule,
    state: CounterState,
    /// The instant (µs) after which the counter holds nothing that counts.
    expires_at: u64,
}

#[derive(Clone, Copy)]
enum CounterState {
    Window(FixedWindowState),
    Tat(u64),
}

/// The state of `rule` among a limiter's counters.
fn counter(counters: &[Counter], rule: &Rule) -> Option<CounterState> {
    counters.iter().find(|c| c.rule == *rule).map(|c| c.state)
}

/// The fixed window of `rule` among a limiter's counters.
fn window(counters: &[Counter], rule: &Rule) -> Option<FixedWindowState> {
    match counter(counters, rule) {
        Some(CounterState::Window(w)) => Some(w),
        _ => None,
    }
}

/// The theoretical arrival time of GCRA `rule` among a limiter's counters.
fn tat(counters: &[Counter], rule: &Rule) -> Option<u64> {
    match counter(counters, rule) {
        Some(CounterState::Tat(t)) => Some(t),
        _ => None,
    }
}

/// What `rule` says about `cost` more units at `now`, over a limiter's log and counters.
fn outcome(log: &[u64], counters: &[Counter], rule: &Rule, now: u64, cost: u64) -> RuleOutcome {
    match rule.algorithm() {
        Algorithm::SlidingLog => algorithm::sliding_log(log, now, rule, cost),
        Algorithm::FixedWindow => {
            algorithm::fixed_window(window(counters, rule), now, rule, cost).0
        }
        Algorithm::Gcra => algorithm::gcra(tat(counters, rule), now, rule, cost).0,
    }
}

impl RuleStates {
    /// Forgets everything, keeping the allocations (an expired entry being reused).
    pub(super) fn clear(&mut self) {
        self.log.clear();
        self.counters.clear();
    }

    /// The log as one slice (sorted, oldest first), and the counters.
    fn view(&mut self) -> (&[u64], &[Counter]) {
        let log = if self.log.is_empty() {
            &[]
        } else {
            &*self.log.make_contiguous()
        };
        (log, &self.counters)
    }

    /// Every rule's outcome into `out`; true if all admit.
    pub(super) fn evaluate(
        &mut self,
        rules: &[Rule],
        now: u64,
        cost: u64,
        out: &mut [RuleOutcome],
    ) -> bool {
        let (log, counters) = self.view();
        let mut allowed = true;
        for (o, rule) in out.iter_mut().zip(rules) {
            *o = outcome(log, counters, rule, now, cost);
            allowed &= o.allowed;
        }
        allowed
    }

    /// After a denial: the rules that would have admitted report the state as it stays, which
    /// is what they say for a cost of zero.
    pub(super) fn settle(&mut self, rules: &[Rule], now: u64, out: &mut [RuleOutcome]) {
        let (log, counters) = self.view();
        for (o, rule) in out.iter_mut().zip(rules) {
            if o.allowed {
                *o = outcome(log, counters, rule, now, 0);
            }
        }
    }

    /// Records `cost` units that every rule admitted at `now`; returns until when the states
    /// count.
    pub(super) fn record(&mut self, rules: &[Rule], now: u64, cost: u64) -> u64 {
        self.counters.retain(|c| c.expires_at > now);
        let mut expires_at = now;
        let log_window = rules
            .iter()
            .filter(|r| r.algorithm() == Algorithm::SlidingLog)
            .map(Rule::window_us)
            .max();
        if let Some(window) = log_window {
            if let Some(edge) = now.checked_sub(window) {
                while self.log.front().is_some_and(|&t| t <= edge) {
                    self.log.pop_front();
                }
            }
            if self.log.back().is_none_or(|&t| t <= now) {
                for _ in 0..cost {
                    self.log.push_back(now);
                }
            } else {
                // Keep the log sorted even if the clock stepped back.
                let at = self.log.partition_point(|&t| t <= now);
                for _ in 0..cost {
                    self.log.insert(at, now);
                }
            }
            expires_at = now + window;
        }
        for rule in rules {
            let (state, until) = match rule.algorithm() {
                Algorithm::SlidingLog => continue,
                Algorithm::FixedWindow => {
                    let state = window(&self.counters, rule);
                    let (_, next) = algorithm::fixed_window(state, now, rule, cost);
                    let Some(next) = next else { continue };
                    (CounterState::Window(next), next.start + rule.window_us())
                }
                Algorithm::Gcra => {
                    let (_, next) = algorithm::gcra(tat(&self.counters, rule), now, rule, cost);
                    let Some(next) = next else { continue };
                    (CounterState::Tat(next), next)
                }
            };
            match self.counters.iter_mut().find(|c| c.rule == *rule) {
                Some(c) => {
                    c.state = state;
                    c.expires_at = until;
                }
                None => self.counters.push(Counter {
                    rule: *rule,
                    state,
                    expires_at: until,
                }),
            }
            expires_at = expires_at.max(until);
        }
        expires_at
    }
}
