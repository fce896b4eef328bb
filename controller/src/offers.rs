//! A GPU offered back: on each sync the leader offers the free units to the users
//! whose notebooks run on CPU (core's [`gpu_booking_core::offers`] decides who, in
//! what order, for how long), reports the whole list to the booking service
//! (`PUT /api/v1/offers`: the service tells each newly offered user, and the
//! webhook holds each offer's units for its user), and, with `--on-expiry
//! hub-restart`, restarts the server of a user who opted in once the hub has seen
//! it idle for `--offer-restart-idle`.
//!
//! Idle means the hub's `last_activity` of the server (the proxy's traffic and the
//! single-user server's own activity reports), not GPU activity: a notebook on CPU
//! has none to judge it by. A restart goes through the hub (`stop`, then `start`
//! with the server's `user_options` kept), and the new pod passes the webhook,
//! which gives it the unit held for its user.
//!
//! What a pod says of its wants and its server is read here from its annotations
//! (the loop's pod view keeps neither): [`GPU_WANTED_ANNOTATION`] and KubeSpawner's
//! server name.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use gpu_booking_client::{ClientError, NotebookStanding, Offer, Offers, OffersReport};
use gpu_booking_core::offers::{
    OfferBook, OfferSettings, Round, Waiting, Wanted, GPU_WANTED_ANNOTATION,
};
use gpu_booking_core::pod_action::OnExpiry;
use tokio::sync::mpsc;

use crate::actions::Ctx;
use crate::config::ControllerArgs;
use crate::pods::{PodInfo, PodLite};

/// A user the service left out for a booking is not offered again before this.
const BOOKED_RECHECK: TimeDelta = TimeDelta::seconds(60);
/// How often an opted-in user's server is asked about again while it is busy.
const IDLE_RECHECK: TimeDelta = TimeDelta::seconds(30);

/// What a pod's annotations say that the loop's pod view does not keep.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Marks {
    uid: String,
    wanted: Option<Wanted>,
    server: String,
}

/// What a task reports back.
enum Done {
    /// The service's answer to a report (or the offers taken back when elected).
    Reported(Result<Offers, ClientError>, bool),
    /// A restart of `user`'s server for their offer ended.
    Restart {
        user: String,
        offered_at: DateTime<Utc>,
        outcome: RestartOutcome,
    },
}

#[derive(Debug)]
enum RestartOutcome {
    Restarted,
    Busy,
    Failed(String),
}

/// The loop's offers part.
pub struct OfferPart {
    ctx: Arc<Ctx>,
    settings: OfferSettings,
    restart_idle: TimeDelta,
    /// Restarts through the hub (`--on-expiry hub-restart` with a hub).
    restarts: bool,
    enabled: bool,
    marks: HashMap<(String, String), Marks>,
    book: OfferBook,
    /// Users the service left out for a booking, until when.
    booked: BTreeMap<String, DateTime<Utc>>,
    /// The offers were taken back from the service (after an election).
    adopted: bool,
    in_flight: bool,
    /// The list changed since the service last took it.
    dirty: bool,
    /// Restarts asked for (per offer) and when each was last tried.
    restarting: BTreeMap<(String, DateTime<Utc>), (DateTime<Utc>, bool)>,
    tx: mpsc::UnboundedSender<Done>,
    rx: mpsc::UnboundedReceiver<Done>,
}

fn delta(d: Duration) -> TimeDelta {
    TimeDelta::from_std(d).unwrap_or(TimeDelta::MAX)
}

impl OfferPart {
    pub fn new(ctx: Arc<Ctx>, args: &ControllerArgs) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        Self {
            restarts: args.on_expiry == OnExpiry::HubRestart && ctx.hub.is_some(),
            ctx,
            settings: OfferSettings {
                window: delta(args.offer_window),
                hold: delta(args.offer_hold),
                quiet: delta(args.offer_quiet),
            },
            restart_idle: delta(args.offer_restart_idle),
            enabled: !args.offer_window.is_zero() && !args.offer_hold.is_zero(),
            marks: HashMap::new(),
            book: OfferBook::default(),
            booked: BTreeMap::new(),
            adopted: false,
            in_flight: false,
            dirty: true,
            restarting: BTreeMap::new(),
            tx,
            rx,
        }
    }

    /// A pod came or changed: what its annotations say of its wants and server.
    pub fn seen(&mut self, pod: &PodLite, info: &PodInfo) {
        let annotations = pod.metadata.annotations.as_ref();
        let get = |k: &str| annotations.and_then(|a| a.get(k)).map(String::as_str);
        let marks = Marks {
            uid: info.uid.clone(),
            wanted: get(GPU_WANTED_ANNOTATION).and_then(Wanted::parse),
            server: get(crate::hub::SERVER_NAME_KEY)
                .unwrap_or_default()
                .to_owned(),
        };
        self.marks
            .insert((info.namespace.clone(), info.name.clone()), marks);
    }

    /// A pod went.
    pub fn forget(&mut self, uid: &str) {
        self.marks.retain(|_, m| m.uid != uid);
    }

    /// Elected (true) or not: a new leader takes the service's offers back first.
    pub fn on_leadership(&mut self, leader: bool) {
        self.adopted = false;
        self.dirty = true;
        if !leader {
            self.book = OfferBook::default();
            self.restarting.clear();
        }
    }

    /// The offers outstanding (for the tests and the metrics).
    pub fn offers(&self) -> &[Offer] {
        self.book.offers()
    }

    /// One round, on each sync of the leader with every pod listed: answers that
    /// came back are taken, offers that ended go, free units are offered, the list
    /// is reported when it changed, and idle servers of opted-in users restarted.
    pub fn round(&mut self, pods: &HashMap<String, PodInfo>, free: Option<BTreeMap<String, u64>>) {
        while let Ok(done) = self.rx.try_recv() {
            self.take(done);
        }
        if !self.enabled || self.in_flight {
            return;
        }
        let now = self.ctx.clock.now();
        if !self.adopted {
            self.in_flight = true;
            let (ctx, tx) = (self.ctx.clone(), self.tx.clone());
            tokio::spawn(async move {
                let _ = tx.send(Done::Reported(ctx.booking.offers().await, true));
            });
            return;
        }
        let Some(free) = free else { return };
        self.booked.retain(|_, until| *until > now);
        let notebooks = crate::notebooks::of(pods);
        let on_gpu: BTreeSet<String> = notebooks
            .iter()
            .filter(|n| n.standing != NotebookStanding::Stripped)
            .map(|n| n.user.clone())
            .collect();
        let waiting: Vec<Waiting> = notebooks
            .iter()
            .filter(|n| n.standing == NotebookStanding::Stripped)
            .filter_map(|n| {
                let marks = self.marks.get(&(n.namespace.clone(), n.pod.clone()))?;
                Some(Waiting {
                    user: n.user.clone(),
                    namespace: n.namespace.clone(),
                    pod: n.pod.clone(),
                    wanted: marks.wanted.clone()?,
                    since: n.started?,
                })
            })
            .collect();
        let booked: BTreeSet<String> = self.booked.keys().cloned().collect();
        let round = Round {
            now,
            waiting: &waiting,
            on_gpu: &on_gpu,
            booked: &booked,
            free: &free,
        };
        self.dirty |= self.book.round(&round, &self.settings);
        self.ctx
            .metrics
            .offers
            .set(i64::try_from(self.book.offers().len()).unwrap_or(i64::MAX));
        if self.dirty {
            self.report();
        } else {
            self.restart_idle_servers(now);
        }
    }

    fn report(&mut self) {
        let report = OffersReport {
            offers: self.book.offers().to_vec(),
        };
        if self.ctx.dry_run {
            tracing::info!(
                offers = report.offers.len(),
                "dry run: would report the offers"
            );
            self.dirty = false;
            return;
        }
        self.in_flight = true;
        let (ctx, tx) = (self.ctx.clone(), self.tx.clone());
        tokio::spawn(async move {
            let _ = tx.send(Done::Reported(ctx.booking.put_offers(&report).await, false));
        });
    }

    fn take(&mut self, done: Done) {
        match done {
            Done::Reported(Ok(answer), taken_back) => {
                self.in_flight = false;
                if taken_back {
                    self.adopted = true;
                } else {
                    self.dirty = false;
                    self.ctx.metrics.action("report_offers", "done");
                }
                let until = self.ctx.clock.now() + BOOKED_RECHECK;
                for user in answer.booked {
                    self.booked.insert(user, until);
                }
                self.book.adopt(answer.offers);
                let current: BTreeSet<(String, DateTime<Utc>)> = self
                    .book
                    .offers()
                    .iter()
                    .map(|o| (o.user.clone(), o.offered_at))
                    .collect();
                self.restarting.retain(|k, _| current.contains(k));
            }
            Done::Reported(Err(e), taken_back) => {
                self.in_flight = false;
                self.ctx.metrics.error("booking");
                if !taken_back {
                    self.ctx.metrics.action("report_offers", "error");
                }
                tracing::warn!(error = %e, "could not report or read the offers; trying again");
            }
            Done::Restart {
                user,
                offered_at,
                outcome,
            } => {
                let key = (user.clone(), offered_at);
                match outcome {
                    RestartOutcome::Restarted => {
                        self.ctx.metrics.action("offer_restart", "done");
                        tracing::info!(user, "restarted on an offered GPU through JupyterHub");
                        if let Some(entry) = self.restarting.get_mut(&key) {
                            entry.1 = true;
                        }
                    }
                    RestartOutcome::Busy => {}
                    RestartOutcome::Failed(why) => {
                        self.ctx.metrics.action("offer_restart", "error");
                        tracing::warn!(user, error = %why, "could not restart on an offered GPU");
                    }
                }
            }
        }
    }

    /// Restarts, through the hub, the servers of users who opted in (`restart` of
    /// the service's answer) once idle; each offer's at most once.
    fn restart_idle_servers(&mut self, now: DateTime<Utc>) {
        if !self.restarts {
            return;
        }
        let Some(hub) = self.ctx.hub.clone() else {
            return;
        };
        if !hub.usable() {
            return;
        }
        for offer in self.book.offers().iter().filter(|o| o.restart) {
            let key = (offer.user.clone(), offer.offered_at);
            let due = match self.restarting.get(&key) {
                None => true,
                Some((_, true)) => false,
                Some((tried, false)) => now - *tried >= IDLE_RECHECK,
            };
            let Some(marks) = self
                .marks
                .get(&(offer.namespace.clone(), offer.pod.clone()))
            else {
                continue;
            };
            if !due {
                continue;
            }
            self.restarting.insert(key, (now, false));
            let (hub, tx, idle) = (hub.clone(), self.tx.clone(), self.restart_idle);
            let (user, server, offered_at) =
                (offer.user.clone(), marks.server.clone(), offer.offered_at);
            let hold = (offer.until - now).to_std().unwrap_or(Duration::ZERO);
            tokio::spawn(async move {
                let outcome = restart_if_idle(&hub, &user, &server, idle, now, hold).await;
                let _ = tx.send(Done::Restart {
                    user,
                    offered_at,
                    outcome,
                });
            });
        }
    }
}

/// Stops and starts `user`'s server `server` when the hub saw no activity of it for
/// `idle`; waits for the stop at most the rest of the offer's hold.
async fn restart_if_idle(
    hub: &crate::hub::Hub,
    user: &str,
    server: &str,
    idle: TimeDelta,
    now: DateTime<Utc>,
    hold: Duration,
) -> RestartOutcome {
    match hub.last_activity(user, server).await {
        Ok(Some(at)) if now - at < idle => return RestartOutcome::Busy,
        Ok(_) => {}
        Err(e) => return RestartOutcome::Failed(e.to_string()),
    }
    if let Err(e) = hub.stop(user, server).await {
        return RestartOutcome::Failed(e.to_string());
    }
    match hub.start(user, server, hold).await {
        Ok(()) => RestartOutcome::Restarted,
        Err(e) => RestartOutcome::Failed(e.to_string()),
    }
}
