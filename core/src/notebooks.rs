//! "My notebooks": which pods are a user's notebooks, how each has its GPU (booked,
//! lent, or stripped to CPU), why, until when, and what its user can do next. The
//! controller decides it from the pods it watches and reports the list with the
//! units held ([`crate::wire::HeldReport::notebooks`]); the booking service only
//! stores and serves it.
//!
//! Only our marks count, read as far as they are believed ([`crate::admission::marks`]):
//!
//! - booked: a GPU pod of our high class (`trusted_priority`), which only the
//!   webhook's booked decision gives;
//! - lent: a GPU pod with our `priority=low` label, which the webhook removes from
//!   whatever a creator wrote and writes only when it lends a unit (or a booked pod
//!   that calls itself high without our class: lent is what it is treated as);
//! - stripped: a pod without a GPU that carries the note the webhook writes when it
//!   strips one at spawn, and the controller when it re-creates one on CPU
//!   (`gpu-booking.io/gpu-removed`), in a namespace the controller serves. The
//!   webhook keeps that note where a pod's creator wrote it (it grants nothing), so
//!   a creator could make a CPU pod of theirs show as stripped on the card of the
//!   user it names, no more.
//!
//! A GPU pod without our priority label is another workload, not a notebook.

use std::cmp::Reverse;
use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use crate::admission::PodStanding;
use crate::usage::ACTIVITY_REPORT_STEP;
use crate::wire::notebooks::{
    NextStep, Notebook, NotebookStanding, MAX_REPORTED_NOTEBOOKS, MAX_WHY_LEN,
};

/// What the decision reads of a pod: only our marks, as far as they are believed.
#[derive(Debug, Clone, Default)]
pub struct PodFacts<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    /// The user the pod names (`hub.jupyter.org/username`, annotation then label).
    pub user: Option<&'a str>,
    /// Our priority label, as far as it is believed (core's `trusted_priority`).
    pub standing: Option<PodStanding>,
    /// GPUs it asks for; `None`: it asks for none.
    pub gpus: Option<u64>,
    /// The model its GPU resource or our model label names.
    pub model: Option<&'a str>,
    pub booking_id: Option<i64>,
    /// `gpu-booking.io/gpu-removed`: why its GPU was removed.
    pub gpu_removed: Option<&'a str>,
    /// `terminate-at`, believed on a booked pod only.
    pub terminate_at: Option<DateTime<Utc>>,
    /// `gpu-booking.io/preempt-at`: when its lent GPU is taken back.
    pub preempt_at: Option<DateTime<Utc>>,
    pub last_activity: Option<DateTime<Utc>>,
    pub started: Option<DateTime<Utc>>,
    /// Running or waiting to: neither finished nor being deleted.
    pub live: bool,
    /// In a namespace the controller serves.
    pub served: bool,
}

/// The notebook `pod` is, if it is one of a user's notebooks.
pub fn notebook(pod: &PodFacts<'_>) -> Option<Notebook> {
    let user = pod.user.filter(|u| !u.is_empty())?;
    if !pod.live || pod.name.is_empty() || pod.namespace.is_empty() {
        return None;
    }
    let model = pod.model.map(str::to_owned);
    let (standing, why, gpus) = match (pod.gpus, pod.standing) {
        (Some(gpus), Some(PodStanding::High)) => (
            NotebookStanding::Booked,
            match pod.booking_id {
                Some(id) => format!("booked: your booking {id} gives it its GPU until it ends"),
                None => "booked: your booking gives it its GPU until it ends".to_owned(),
            },
            gpus,
        ),
        (Some(gpus), Some(PodStanding::Low)) => (
            NotebookStanding::Lent,
            match pod.preempt_at {
                Some(_) => "lent without a booking, and a booked user needs this GPU: save \
                            your work, it is taken back at the time shown"
                    .to_owned(),
                None => "lent without a booking: a free GPU, which a booked user may take \
                         back (after a warning)"
                    .to_owned(),
            },
            gpus,
        ),
        (None, _) if pod.served => {
            let removed = pod.gpu_removed?;
            (
                NotebookStanding::Stripped,
                format!("on CPU: {}", one_line(removed)),
                0,
            )
        }
        _ => return None,
    };
    let booked = standing == NotebookStanding::Booked;
    Some(Notebook {
        user: user.to_owned(),
        namespace: pod.namespace.to_owned(),
        pod: pod.name.to_owned(),
        standing,
        model: if standing == NotebookStanding::Stripped {
            None
        } else {
            model
        },
        gpus: crate::wire::reported(gpus),
        booking_id: pod.booking_id.filter(|_| booked),
        why,
        ends_at: pod.terminate_at.filter(|_| booked),
        taken_back_at: pod
            .preempt_at
            .filter(|_| standing == NotebookStanding::Lent),
        last_activity: pod.last_activity,
        started: pod.started,
        next: next_steps(standing),
        offer: None,
    })
}

/// What a notebook's user can do next: a booked one's booking can be extended; a
/// lent or stripped one keeps or gets a GPU with a booking.
pub fn next_steps(standing: NotebookStanding) -> Vec<NextStep> {
    match standing {
        NotebookStanding::Booked => vec![NextStep::Extend],
        NotebookStanding::Lent | NotebookStanding::Stripped => vec![NextStep::Book],
    }
}

/// The text a pod's note can be shown as: one line (a control character becomes a
/// space), at most the report's bound, since the note is whatever the pod carries.
fn one_line(note: &str) -> String {
    let limit = MAX_WHY_LEN - "on CPU: ".len();
    let text: String = note
        .trim()
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    match text.char_indices().nth(limit) {
        Some((cut, _)) => {
            let mut short = text[..cut].to_owned();
            short.pop();
            short.push('…');
            short
        }
        None => text,
    }
}

/// The notebooks of `pods`, in the order the service keeps them (namespace, pod), at
/// most [`MAX_REPORTED_NOTEBOOKS`]: beyond it, those with a GPU first (a booking's
/// end and a lent GPU's deadline are what their users must not miss), then those on
/// CPU, newest first.
pub fn notebooks<'a>(pods: impl IntoIterator<Item = PodFacts<'a>>) -> Vec<Notebook> {
    let mut out: Vec<Notebook> = pods.into_iter().filter_map(|p| notebook(&p)).collect();
    if out.len() > MAX_REPORTED_NOTEBOOKS {
        out.sort_by_key(|n| (n.standing == NotebookStanding::Stripped, Reverse(n.started)));
        out.truncate(MAX_REPORTED_NOTEBOOKS);
    }
    out.sort_by(|a, b| (&a.namespace, &a.pod).cmp(&(&b.namespace, &b.pod)));
    out
}

/// Whether the notebooks seen now are news to the booking service, which was last
/// told `reported`: any change but a last activity that moved by less than
/// [`ACTIVITY_REPORT_STEP`] (the agent writes it every minute of use; the usage
/// report's resolution is enough for "last GPU activity").
pub fn notebooks_moved(reported: &[Notebook], seen: &[Notebook]) -> bool {
    let without_activity = |list: &[Notebook]| -> Vec<Notebook> {
        list.iter()
            .map(|n| Notebook {
                last_activity: None,
                ..n.clone()
            })
            .collect()
    };
    if without_activity(reported) != without_activity(seen) {
        return true;
    }
    let activity = |list: &[Notebook]| -> BTreeMap<(String, String), DateTime<Utc>> {
        list.iter()
            .filter_map(|n| Some(((n.namespace.clone(), n.pod.clone()), n.last_activity?)))
            .collect()
    };
    let (was, now) = (activity(reported), activity(seen));
    now.iter().any(|(pod, at)| match was.get(pod) {
        None => true,
        Some(before) => *at - *before >= ACTIVITY_REPORT_STEP,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeDelta;

    fn t(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    fn gpu_pod(standing: PodStanding) -> PodFacts<'static> {
        PodFacts {
            namespace: "jhub",
            name: "jupyter-alice",
            user: Some("alice"),
            standing: Some(standing),
            gpus: Some(1),
            model: Some("a100"),
            booking_id: Some(7),
            terminate_at: Some(t("2026-12-01T10:00:00Z")),
            preempt_at: Some(t("2026-11-30T10:32:00Z")),
            last_activity: Some(t("2026-11-30T10:00:00Z")),
            started: Some(t("2026-11-30T09:00:00Z")),
            live: true,
            served: true,
            ..PodFacts::default()
        }
    }

    fn cpu_pod(note: Option<&'static str>) -> PodFacts<'static> {
        PodFacts {
            gpus: None,
            standing: None,
            model: None,
            booking_id: None,
            terminate_at: None,
            preempt_at: None,
            gpu_removed: note,
            ..gpu_pod(PodStanding::Low)
        }
    }

    #[test]
    fn a_booked_notebook_ends_with_its_booking_and_can_be_extended() {
        let n = notebook(&gpu_pod(PodStanding::High)).unwrap();
        assert_eq!(n.standing, NotebookStanding::Booked);
        assert_eq!((n.model.as_deref(), n.gpus), (Some("a100"), 1));
        assert_eq!(n.booking_id, Some(7));
        assert_eq!(n.ends_at, Some(t("2026-12-01T10:00:00Z")));
        assert_eq!(n.taken_back_at, None, "a booked pod is never taken back");
        assert_eq!(n.next, vec![NextStep::Extend]);
        assert!(n.why.contains("booking 7"), "{}", n.why);
    }

    #[test]
    fn a_lent_notebook_shows_when_it_is_taken_back() {
        let n = notebook(&gpu_pod(PodStanding::Low)).unwrap();
        assert_eq!(n.standing, NotebookStanding::Lent);
        assert_eq!(n.taken_back_at, Some(t("2026-11-30T10:32:00Z")));
        assert_eq!(
            (n.booking_id, n.ends_at),
            (None, None),
            "no booking of its own"
        );
        assert_eq!(n.next, vec![NextStep::Book]);
        assert!(n.why.contains("taken back"), "{}", n.why);
        let unmarked = notebook(&PodFacts {
            preempt_at: None,
            ..gpu_pod(PodStanding::Low)
        })
        .unwrap();
        assert_eq!(unmarked.taken_back_at, None);
        assert!(unmarked.why.contains("may take"), "{}", unmarked.why);
    }

    #[test]
    fn a_stripped_notebook_says_why_in_the_webhooks_words() {
        let n = notebook(&cpu_pod(Some("no free a100 GPU and no active booking"))).unwrap();
        assert_eq!(n.standing, NotebookStanding::Stripped);
        assert_eq!((n.model, n.gpus), (None, 0));
        assert_eq!(n.why, "on CPU: no free a100 GPU and no active booking");
        assert_eq!(n.next, vec![NextStep::Book]);
        assert_eq!(n.last_activity, Some(t("2026-11-30T10:00:00Z")));
    }

    #[test]
    fn only_our_marks_make_a_notebook() {
        // A CPU pod without the note is no notebook that lost its GPU.
        assert!(notebook(&cpu_pod(None)).is_none());
        // A GPU pod without our priority label is another workload.
        assert!(notebook(&PodFacts {
            standing: None,
            ..gpu_pod(PodStanding::Low)
        })
        .is_none());
        // A CPU pod whose label claims a standing is still only what its note says.
        let claims = notebook(&PodFacts {
            standing: Some(PodStanding::High),
            ..cpu_pod(Some("booking ended"))
        })
        .unwrap();
        assert_eq!(claims.standing, NotebookStanding::Stripped);
        assert_eq!(claims.ends_at, None);
        // A note on a pod outside the served namespaces is not believed.
        assert!(notebook(&PodFacts {
            served: false,
            ..cpu_pod(Some("booking ended"))
        })
        .is_none());
        // Nobody's pod, and pods on their way out, are nobody's notebooks.
        assert!(notebook(&PodFacts {
            user: None,
            ..gpu_pod(PodStanding::High)
        })
        .is_none());
        assert!(notebook(&PodFacts {
            live: false,
            ..gpu_pod(PodStanding::High)
        })
        .is_none());
    }

    #[test]
    fn a_note_is_one_bounded_line() {
        let long = "x".repeat(2 * MAX_WHY_LEN);
        let leaked: &'static str = Box::leak(format!("two\nlines {long}").into_boxed_str());
        let n = notebook(&cpu_pod(Some(leaked))).unwrap();
        assert_eq!(n.problem(), None, "{}", n.why);
        assert!(n.why.starts_with("on CPU: two lines x"), "{}", n.why);
        assert_eq!(n.why.chars().count(), MAX_WHY_LEN);
    }

    #[test]
    fn a_long_list_keeps_the_gpus_then_the_newest_on_cpu() {
        let names: Vec<String> = (0..MAX_REPORTED_NOTEBOOKS + 2)
            .map(|i| format!("jupyter-{i:05}"))
            .collect();
        let start = t("2026-11-30T00:00:00Z");
        let pods = names.iter().enumerate().map(|(i, name)| {
            let mut p = match i {
                // The last two are the only ones with a GPU.
                i if i >= MAX_REPORTED_NOTEBOOKS => gpu_pod(PodStanding::Low),
                _ => cpu_pod(Some("booking ended")),
            };
            p.name = name;
            p.started = Some(start + TimeDelta::minutes(i as i64));
            p
        });
        let kept = notebooks(pods);
        assert_eq!(kept.len(), MAX_REPORTED_NOTEBOOKS);
        let lent = kept
            .iter()
            .filter(|n| n.standing == NotebookStanding::Lent)
            .count();
        assert_eq!(lent, 2, "every notebook with a GPU is kept");
        // The two oldest on CPU give way.
        assert!(kept
            .iter()
            .all(|n| n.pod != "jupyter-00000" && n.pod != "jupyter-00001"));
        assert!(kept.windows(2).all(|w| w[0].pod < w[1].pod), "sorted again");
    }

    #[test]
    fn activity_is_news_only_by_a_step() {
        let seen = notebooks([gpu_pod(PodStanding::High), {
            let mut p = cpu_pod(Some("booking ended"));
            p.name = "jupyter-alice-2";
            p
        }]);
        assert_eq!(seen.len(), 2);
        assert!(seen[0].pod < seen[1].pod, "sorted by namespace and pod");
        assert!(!notebooks_moved(&seen, &seen));
        assert!(notebooks_moved(&[], &seen));
        assert!(notebooks_moved(&seen, &seen[..1]));
        let later = |by: TimeDelta| -> Vec<Notebook> {
            let mut v = seen.clone();
            v[0].last_activity = v[0].last_activity.map(|at| at + by);
            v
        };
        assert!(!notebooks_moved(&seen, &later(TimeDelta::minutes(1))));
        assert!(notebooks_moved(&seen, &later(ACTIVITY_REPORT_STEP)));
        let mut marked = seen.clone();
        marked[0].standing = NotebookStanding::Lent;
        assert!(notebooks_moved(&seen, &marked));
    }
}
