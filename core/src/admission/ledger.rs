//! The webhook's ledger of GPU units it admitted that the booking service's free
//! count cannot reflect yet.
//!
//! The free count of a model is `units - in_use`, where `in_use` is what the
//! controller last reported. Between a pod's admission and the next report that
//! counts it (the pod is created, scheduled, seen by the controller's watch, and the
//! next report is sent: a second or two) every admission reads the same free count,
//! so without more a storm of spawns would be lent far more cards than exist. The
//! ledger keeps each GPU admission (booked or lent) with its time and subtracts
//! those that no report has had the time to count:
//!
//! - the free count used is the one of the newest report seen for the model (any
//!   answer's; a cached answer with an older report does not bring back lends that
//!   a newer report already counts);
//! - an admission is counted by a report taken at least `settle` after it, and then
//!   leaves the ledger; with no such report it leaves after `ttl` (the controller
//!   re-reports every model every few seconds even when nothing changed, so this is
//!   the bound for a controller that stopped reporting). A report's time is the
//!   one the service records, `usage_reported_at`: when the controller counted,
//!   never later than its receipt ([`crate::wire::UsageReport::reported_at`]), so a
//!   count older than an admission does not release it however late it arrives;
//!   `settle` is left for what no time stamp shows (the API server storing the pod,
//!   the watch bringing it to the controller);
//! - memory is bounded: at most [`MAX_MODELS`] models and [`MAX_ENTRIES`] admissions
//!   (a full ledger lends nothing more: it errs on the side of no GPU).
//!
//! The decision and the admission it records happen under one lock
//! ([`LendLedger::decide`]), so two concurrent admissions cannot both take the last
//! free unit. Several webhook replicas each keep their own ledger; what they lend
//! together beyond the cards is caught by the controller (a lent pod that stays
//! Pending for want of a GPU is recreated CPU-only, [`crate::eviction`]).

use std::collections::{BTreeMap, VecDeque};

use chrono::{DateTime, TimeDelta, Utc};

use super::{decide, AdmissionConfig, Decision, GpuRequest, Lookup, Schedulability};
use crate::gpu_model::ModelName;

/// Models tracked at most (the booking service declares them: a few).
pub const MAX_MODELS: usize = 256;
/// Admissions kept at most, over all models.
pub const MAX_ENTRIES: usize = 16_384;

/// What the ledger knows of one model.
#[derive(Debug, Default, Clone)]
struct ModelLedger {
    /// The newest usage report seen: when it was counted (`usage_reported_at`;
    /// `None`: the service does not say) and the free units it left.
    report: Option<(Option<DateTime<Utc>>, u64)>,
    /// GPU units admitted and not yet counted by a report, oldest first.
    admitted: VecDeque<(DateTime<Utc>, u64)>,
    /// The sum of `admitted`'s units, kept as they come and go: a decision reads it
    /// without walking the queue (at 2,000 admissions a second the queue holds
    /// thousands).
    outstanding: u64,
}

impl ModelLedger {
    fn push(&mut self, at: DateTime<Utc>, units: u64) {
        self.admitted.push_back((at, units));
        self.outstanding = self.outstanding.saturating_add(units);
    }

    /// Forgets the admissions that a report taken at `counted_by` counts or that are
    /// older than `ttl`. Both hold for a prefix of the queue (admissions are pushed
    /// in time order), so this stops at the first one kept: the cost is what leaves,
    /// not what stays. (Should the clock step back, an admission behind a newer one
    /// waits for it: the ledger then lends less for a while, never more.) Returns how
    /// many left.
    fn forget(
        &mut self,
        counted_by: Option<DateTime<Utc>>,
        settle: TimeDelta,
        ttl: TimeDelta,
        now: DateTime<Utc>,
    ) -> usize {
        let mut gone = 0;
        while let Some(&(at, units)) = self.admitted.front() {
            let counted = counted_by.is_some_and(|r| at + settle <= r);
            let expired = at + ttl <= now;
            if !counted && !expired {
                break;
            }
            self.admitted.pop_front();
            self.outstanding = self.outstanding.saturating_sub(units);
            gone += 1;
        }
        gone
    }
}

/// See the module documentation.
#[derive(Debug, Clone)]
pub struct LendLedger {
    settle: TimeDelta,
    ttl: TimeDelta,
    models: BTreeMap<ModelName, ModelLedger>,
    entries: usize,
}

impl LendLedger {
    /// A ledger whose admissions count until a report taken `settle` after them (or
    /// `ttl` has passed). A zero `ttl` turns it off: every answer is taken as it is.
    pub fn new(settle: std::time::Duration, ttl: std::time::Duration) -> Self {
        let delta = |d: std::time::Duration| TimeDelta::from_std(d).unwrap_or(TimeDelta::MAX);
        Self {
            settle: delta(settle),
            ttl: delta(ttl),
            models: BTreeMap::new(),
            entries: 0,
        }
    }

    fn enabled(&self) -> bool {
        self.ttl > TimeDelta::zero()
    }

    /// GPU units admitted on `model` that no report has counted yet.
    pub fn outstanding(&self, model: &ModelName) -> u64 {
        self.models.get(model).map_or(0, |m| m.outstanding)
    }

    /// Admissions held, over all models.
    pub fn len(&self) -> usize {
        self.entries
    }

    pub fn is_empty(&self) -> bool {
        self.entries == 0
    }

    /// Learns the free counts of `answer` (where its report is newer than the one
    /// known) and forgets the admissions that the newest reports count, or that are
    /// older than the time to live.
    fn observe(&mut self, answer: &Schedulability, now: DateTime<Utc>) {
        for (model, &free) in &answer.free {
            let reported = answer.usage_reported_at.get(model).copied();
            if !self.models.contains_key(model) && self.models.len() >= MAX_MODELS {
                continue;
            }
            let entry = self.models.entry(model.clone()).or_default();
            let newer = match (&entry.report, reported) {
                (None, _) => true,
                (Some((Some(known), _)), Some(r)) => r > *known,
                (Some((None, _)), _) => true,
                (Some((Some(_), _)), None) => false,
            };
            if newer {
                entry.report = Some((reported, free));
            }
        }
        let (settle, ttl) = (self.settle, self.ttl);
        let mut dropped = 0;
        for entry in self.models.values_mut() {
            let counted_by = entry.report.and_then(|(at, _)| at);
            dropped += entry.forget(counted_by, settle, ttl, now);
        }
        self.entries -= dropped;
    }

    /// `answer` with each model's free units as the ledger sees them: the newest
    /// report's count less what was admitted since (never below zero; zero when the
    /// ledger is full).
    fn adjusted(&self, answer: &Schedulability) -> Schedulability {
        let mut seen = answer.clone();
        let full = self.entries >= MAX_ENTRIES;
        for (model, free) in seen.free.iter_mut() {
            let Some(entry) = self.models.get(model) else {
                // Beyond MAX_MODELS: untracked, so nothing is lent on it.
                *free = 0;
                continue;
            };
            let reported = entry.report.map_or(*free, |(_, f)| f);
            *free = if full {
                0
            } else {
                reported.saturating_sub(self.outstanding(model))
            };
        }
        seen
    }

    /// Records `units` of `model` admitted at `now` without a decision of the ledger's
    /// (the controller's own lent copy, [`super::controller_copy`]): the unit it takes
    /// over may already read as free in the next report, so it is kept until a report
    /// counts it, as any admission. Nothing when the ledger is off or full.
    pub fn record(&mut self, model: &ModelName, units: u64, now: DateTime<Utc>) {
        if !self.enabled() || self.entries >= MAX_ENTRIES {
            return;
        }
        if !self.models.contains_key(model) && self.models.len() >= MAX_MODELS {
            return;
        }
        let entry = self.models.entry(model.clone()).or_default();
        entry.push(now, units.max(1));
        self.entries += 1;
    }

    /// [`decide`] on `answer` as the ledger sees it; when the pod gets a GPU and
    /// `record` (not a dry run), its units join the ledger. One call under one lock:
    /// the free unit a decision takes is gone for the next.
    pub fn decide(
        &mut self,
        gpu: &GpuRequest,
        answer: &Schedulability,
        cfg: &AdmissionConfig,
        now: DateTime<Utc>,
        record: bool,
    ) -> Decision {
        if !self.enabled() {
            return decide(gpu, Lookup::Answer(answer), cfg, now);
        }
        self.observe(answer, now);
        let seen = self.adjusted(answer);
        let decision = decide(gpu, Lookup::Answer(&seen), cfg, now);
        if let (true, Some(model)) = (record, decision.model()) {
            if self.entries < MAX_ENTRIES {
                if let Some(entry) = self.models.get_mut(model) {
                    entry.push(now, gpu.units.max(1));
                    self.entries += 1;
                }
            }
        }
        decision
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::time::Duration;

    fn model(name: &str) -> ModelName {
        ModelName::parse(name).unwrap()
    }

    fn t(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap()
    }

    fn one() -> GpuRequest {
        GpuRequest {
            units: 1,
            models: BTreeSet::new(),
        }
    }

    /// An unbooked user's answer: `free` units of a100, reported at `reported`.
    fn answer(free: u64, reported: Option<i64>) -> Schedulability {
        Schedulability {
            schedulable: false,
            until: None,
            model: None,
            booking_id: None,
            user: Some("u".into()),
            free: [(model("a100"), free)].into_iter().collect(),
            gpumem_mib: BTreeMap::new(),
            earliest_booking: None,
            gpumem_advertised_mib: None,
            earliest_booking_by_model: BTreeMap::new(),
            units: None,
            units_held: None,
            usage_reported_at: reported
                .map(|r| [(model("a100"), t(r))].into_iter().collect())
                .unwrap_or_default(),
            offers: Vec::new(),
            course: false,
        }
    }

    fn ledger() -> LendLedger {
        LendLedger::new(Duration::from_secs(3), Duration::from_secs(60))
    }

    #[test]
    fn a_storm_gets_no_more_than_the_free_units() {
        let cfg = AdmissionConfig::default();
        let mut l = ledger();
        // 200 admissions read one stale answer: 6 free.
        let a = answer(6, Some(0));
        let lent = (0..200)
            .filter(|_| l.decide(&one(), &a, &cfg, t(1), true).model().is_some())
            .count();
        assert_eq!(lent, 6);
        assert_eq!(l.outstanding(&model("a100")), 6);
        // Without the ledger, every one of them would have been lent.
        let mut off = LendLedger::new(Duration::ZERO, Duration::ZERO);
        let lent = (0..200)
            .filter(|_| off.decide(&one(), &a, &cfg, t(1), true).model().is_some())
            .count();
        assert_eq!(lent, 200);
    }

    #[test]
    fn a_report_taken_after_the_settle_time_releases_what_it_counts() {
        let cfg = AdmissionConfig::default();
        let mut l = ledger();
        assert!(l
            .decide(&one(), &answer(1, Some(0)), &cfg, t(10), true)
            .model()
            .is_some());
        // A report 1 s later may not count the pod yet: the unit stays taken.
        let d = l.decide(&one(), &answer(1, Some(11)), &cfg, t(12), true);
        assert_eq!(d.kind(), "strip");
        // A report taken 3 s after the admission counts it; it says one is free
        // (the pod ended meanwhile): lent again.
        let d = l.decide(&one(), &answer(1, Some(13)), &cfg, t(14), true);
        assert_eq!(d.kind(), "low_priority");
        assert_eq!(l.len(), 1);
        // A cached answer with an older report does not undo the newer one.
        let d = l.decide(&one(), &answer(5, Some(0)), &cfg, t(15), true);
        assert_eq!(d.kind(), "strip");
    }

    #[test]
    fn a_report_releases_the_admissions_before_it_and_keeps_the_sum_of_the_rest() {
        let cfg = AdmissionConfig::default();
        let mut l = ledger();
        // Lent admissions, one per second from t=0 to t=9, 1 or 2 units each, on a
        // model with more free than they take.
        let request = |units: u64| GpuRequest { units, ..one() };
        let a = answer(100, Some(0));
        for s in 0..10 {
            l.decide(&request(1 + (s as u64 % 2)), &a, &cfg, t(s), true);
        }
        assert_eq!(l.outstanding(&model("a100")), 15);
        // A report taken at t=7 counts the admissions of t=0..=4 (settle 3 s): they
        // leave, the sum is of those of t=5..=9 (and the one recorded now, t=10).
        let mut reported = a.clone();
        reported.usage_reported_at = [(model("a100"), t(7))].into_iter().collect();
        l.decide(&request(1), &reported, &cfg, t(10), true);
        assert_eq!(l.len(), 6);
        assert_eq!(l.outstanding(&model("a100")), (2 + 1 + 2 + 1 + 2) + 1);
        // Past the time to live, everything goes but what is recorded then.
        l.decide(&request(2), &reported, &cfg, t(100), true);
        assert_eq!(l.len(), 1);
        assert_eq!(l.outstanding(&model("a100")), 2);
    }

    #[test]
    fn admissions_expire_and_dry_runs_are_not_recorded() {
        let cfg = AdmissionConfig::default();
        let mut l = ledger();
        // A service that does not say when it was told: only the time to live.
        assert_eq!(
            l.decide(&one(), &answer(1, None), &cfg, t(0), false).kind(),
            "low_priority"
        );
        assert!(l.is_empty(), "a dry run takes nothing");
        l.decide(&one(), &answer(1, None), &cfg, t(0), true);
        assert_eq!(
            l.decide(&one(), &answer(1, None), &cfg, t(59), true).kind(),
            "strip"
        );
        assert_eq!(
            l.decide(&one(), &answer(1, None), &cfg, t(60), true).kind(),
            "low_priority"
        );
        assert_eq!(l.len(), 1);
    }

    #[test]
    fn booked_pods_take_their_unit_too_and_units_count() {
        let cfg = AdmissionConfig::default();
        let mut l = ledger();
        let mut booked = answer(2, Some(0));
        booked.schedulable = true;
        booked.until = Some(t(10_000));
        booked.model = Some(model("a100"));
        booked.booking_id = Some(1);
        let two = GpuRequest {
            units: 2,
            models: BTreeSet::new(),
        };
        assert_eq!(l.decide(&two, &booked, &cfg, t(1), true).kind(), "booked");
        assert_eq!(l.outstanding(&model("a100")), 2);
        assert_eq!(
            l.decide(&one(), &answer(2, Some(0)), &cfg, t(1), true)
                .kind(),
            "strip"
        );
    }

    #[test]
    fn a_storm_leaves_a_unit_offered_back_to_its_user() {
        let cfg = AdmissionConfig::default();
        let mut l = ledger();
        let mut a = answer(3, Some(0));
        a.offers = vec![crate::wire::offers::Offer {
            user: "bob".into(),
            model: "a100".into(),
            units: 1,
            namespace: "jhub".into(),
            pod: "jupyter-bob".into(),
            offered_at: t(0),
            until: t(300),
            restart: false,
        }];
        // Others get the two units not held, however many ask.
        let lent = (0..50)
            .filter(|_| l.decide(&one(), &a, &cfg, t(1), true).model().is_some())
            .count();
        assert_eq!(lent, 2);
        // Bob gets the one held for him.
        a.user = Some("bob".into());
        assert_eq!(
            l.decide(&one(), &a, &cfg, t(2), true).kind(),
            "low_priority"
        );
    }

    #[test]
    fn a_count_older_than_an_admission_does_not_release_it_however_late_it_arrives() {
        let cfg = AdmissionConfig::default();
        let mut l = ledger();
        assert_eq!(
            l.decide(&one(), &answer(1, Some(0)), &cfg, t(10), true)
                .kind(),
            "low_priority"
        );
        // The controller counted at 9, before the admission (the pod was not there);
        // its report reached the service at 14, past the settle time. The service
        // records the count's time, so the lend stays: nothing more is lent.
        let report = crate::wire::UsageReport {
            counted_at: Some(t(9)),
            ..Default::default()
        };
        let recorded = report.reported_at(t(14)).timestamp() - t(0).timestamp();
        assert_eq!(recorded, 9);
        let d = l.decide(&one(), &answer(1, Some(recorded)), &cfg, t(15), true);
        assert_eq!(d.kind(), "strip");
        assert_eq!(l.outstanding(&model("a100")), 1);
        // Stamped by its receipt, the same report would have released it: a second
        // lend of the one card.
        let received = crate::wire::UsageReport::default().reported_at(t(14));
        let mut receipt_stamped = ledger();
        receipt_stamped.decide(&one(), &answer(1, Some(0)), &cfg, t(10), true);
        let d = receipt_stamped.decide(
            &one(),
            &answer(1, Some(received.timestamp() - t(0).timestamp())),
            &cfg,
            t(15),
            true,
        );
        assert_eq!(d.kind(), "low_priority");
        // A count that began settle after the admission releases it.
        let d = l.decide(&one(), &answer(1, Some(13)), &cfg, t(16), true);
        assert_eq!(d.kind(), "low_priority");
        // And with only old counts arriving, the time to live still does.
        let mut stale = ledger();
        stale.decide(&one(), &answer(1, Some(0)), &cfg, t(10), true);
        let d = stale.decide(&one(), &answer(1, Some(9)), &cfg, t(69), true);
        assert_eq!(d.kind(), "strip");
        let d = stale.decide(&one(), &answer(1, Some(9)), &cfg, t(70), true);
        assert_eq!(d.kind(), "low_priority");
        assert_eq!(stale.len(), 1, "only the new lend is kept");
    }

    #[test]
    fn memory_is_bounded() {
        let cfg = AdmissionConfig::default();
        let mut l = ledger();
        let mut a = answer(u64::MAX, Some(0));
        for i in 0..(MAX_MODELS + 10) {
            a.free.insert(model(&format!("m{i}")), 1);
        }
        for _ in 0..(MAX_ENTRIES + 10) {
            l.decide(&one(), &a, &cfg, t(1), true);
        }
        assert_eq!(l.len(), MAX_ENTRIES);
        assert!(l.models.len() <= MAX_MODELS);
        // Full: nothing more is lent.
        assert_eq!(l.decide(&one(), &a, &cfg, t(1), true).kind(), "strip");
    }

    #[test]
    fn a_recorded_copy_takes_its_unit_until_a_report_counts_it() {
        let cfg = AdmissionConfig::default();
        let mut l = ledger();
        l.record(&model("a100"), 1, t(10));
        assert_eq!(l.outstanding(&model("a100")), 1);
        // A report from before the copy says one is free: it is the copy's.
        assert_eq!(
            l.decide(&one(), &answer(1, Some(9)), &cfg, t(11), true)
                .kind(),
            "strip"
        );
        // A report taken after the settle time counts it.
        assert_eq!(
            l.decide(&one(), &answer(1, Some(13)), &cfg, t(14), true)
                .kind(),
            "low_priority"
        );
        // Off: nothing is kept.
        let mut off = LendLedger::new(Duration::ZERO, Duration::ZERO);
        off.record(&model("a100"), 1, t(10));
        assert!(off.is_empty());
    }
}
