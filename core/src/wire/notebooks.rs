//! A user's running notebooks as the controller sees them: reported with the units
//! held (`notebooks` of `PUT /api/v1/held-units`, the whole list each time) and
//! served to their user (`GET /api/v1/notebooks`). The booking service does not
//! talk to Kubernetes; this is its only view of the pods. Each state is decided by
//! [`crate::notebooks`].

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// The most notebooks one report may name. The held-units report carries them, and
/// the webhook's counts depend on that report being read: at about 400 bytes a
/// notebook, this many keep it well within the service's request body limit
/// (`MAX_BODY_BYTES`, 2 MiB). A lab with more running notebooks with a GPU or
/// stripped of one is beyond what a page of notebooks serves; the controller keeps
/// the ones that matter most ([`crate::notebooks::notebooks`]).
pub const MAX_REPORTED_NOTEBOOKS: usize = 2_000;
/// The longest user name, namespace or pod name in a report, in bytes (a pod name
/// is at most 253, a user name at most 256).
pub const MAX_NOTEBOOK_NAME_LEN: usize = 256;
/// The longest `why`, in characters: a sentence, not a log.
pub const MAX_WHY_LEN: usize = 512;

/// How a notebook has its GPU, if it has one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum NotebookStanding {
    /// Its user's booking gives it the GPU until the booking ends (`ends_at`).
    Booked,
    /// A free GPU lent without a booking: a booked user may take it back (after a
    /// warning, at `taken_back_at`).
    Lent,
    /// Runs on CPU because its GPU was removed: none was free when it started, or it
    /// was taken back or its booking ended and it was re-created without it.
    Stripped,
}

/// What the notebook's user can do next, in the order the page offers it. Readers
/// ignore a step they do not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum NextStep {
    /// Book a GPU (of `model`, when it names one), so that the notebook keeps or
    /// gets one.
    Book,
    /// Extend the booking (`booking_id`) before it ends.
    Extend,
    /// Restart the server to get the GPU offered back to it (`offer`), before the
    /// offer's `until`.
    Restart,
}

/// One running notebook pod of a user. `i32` counts: see the module
/// [`crate::wire`] on integers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Notebook {
    /// Its user, as the pod names them (`hub.jupyter.org/username`).
    #[cfg_attr(feature = "openapi", schema(min_length = 1, max_length = 256))]
    pub user: String,
    #[cfg_attr(feature = "openapi", schema(min_length = 1, max_length = 256))]
    pub namespace: String,
    /// The pod's name.
    #[cfg_attr(feature = "openapi", schema(min_length = 1, max_length = 256))]
    pub pod: String,
    pub standing: NotebookStanding,
    /// The model of its GPU; null on CPU (and for a GPU of no known model).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(max_length = 256))]
    pub model: Option<String>,
    /// GPUs it holds or waits for; 0 on CPU.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 100000))]
    pub gpus: i32,
    /// The booking it runs under (booked only).
    #[serde(default)]
    pub booking_id: Option<i64>,
    /// Why it stands so, a sentence for its user: for a stripped notebook the
    /// reason written on the pod when its GPU was removed
    /// (`gpu-booking.io/gpu-removed`). No control character.
    #[cfg_attr(
        feature = "openapi",
        schema(max_length = 512, pattern = r"^[^\u0000-\u001f\u007f-\u009f]*$")
    )]
    pub why: String,
    /// When its booking ends and it loses the GPU (`terminate-at`; booked only).
    #[serde(default)]
    pub ends_at: Option<DateTime<Utc>>,
    /// When its lent GPU is taken back for a booked user, after the warning
    /// (`gpu-booking.io/preempt-at`; lent only, and only once it was chosen).
    #[serde(default)]
    pub taken_back_at: Option<DateTime<Utc>>,
    /// Its last GPU activity, as the node agent annotated it
    /// (`gpu-booking.io/last-gpu-activity`).
    #[serde(default)]
    pub last_activity: Option<DateTime<Utc>>,
    /// When it started (or was created, before it started).
    #[serde(default)]
    pub started: Option<DateTime<Utc>>,
    /// What its user can do next.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(max_items = 8))]
    pub next: Vec<NextStep>,
    /// The GPU offered back to this notebook's user for it, held until the offer's
    /// `until` (`GET /api/v1/offers`). Filled in by the service when it answers;
    /// ignored in a report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offer: Option<super::offers::Offer>,
}

impl Notebook {
    /// Why this notebook cannot be recorded, if it cannot: a name empty or too
    /// long, a count out of range, or a `why` too long or with a control character
    /// (the page shows it as one line of text).
    pub fn problem(&self) -> Option<String> {
        let names = [
            ("user", &self.user),
            ("namespace", &self.namespace),
            ("pod", &self.pod),
        ];
        for (what, name) in names {
            if name.is_empty()
                || name.len() > MAX_NOTEBOOK_NAME_LEN
                || name.chars().any(char::is_control)
            {
                return Some(format!(
                    "notebooks: {what} must be 1 to {MAX_NOTEBOOK_NAME_LEN} bytes without \
                     a control character"
                ));
            }
        }
        let pod = format!("{}/{}", self.namespace, self.pod);
        if self.model.as_ref().is_some_and(|m| {
            m.is_empty() || m.len() > MAX_NOTEBOOK_NAME_LEN || m.chars().any(char::is_control)
        }) {
            return Some(format!("notebooks: the model of {pod} is no model name"));
        }
        if !(0..=crate::wire::MAX_HELD_UNITS).contains(&self.gpus) {
            return Some(format!(
                "notebooks: the GPUs of {pod} must be between 0 and {}",
                crate::wire::MAX_HELD_UNITS
            ));
        }
        if self.why.chars().count() > MAX_WHY_LEN || self.why.chars().any(char::is_control) {
            return Some(format!(
                "notebooks: the reason of {pod} is longer than {MAX_WHY_LEN} characters or \
                 holds a control character"
            ));
        }
        if self.next.len() > 8 {
            return Some(format!("notebooks: at most 8 next steps for {pod}"));
        }
        None
    }
}

/// Why a report's notebooks cannot be recorded, if they cannot: too many, or one
/// that [`Notebook::problem`] refuses.
pub fn notebooks_problem(notebooks: &[Notebook]) -> Option<String> {
    if notebooks.len() > MAX_REPORTED_NOTEBOOKS {
        return Some(format!(
            "notebooks: at most {MAX_REPORTED_NOTEBOOKS} per report"
        ));
    }
    if let Some(problem) = notebooks.iter().find_map(Notebook::problem) {
        return Some(problem);
    }
    // A pod is one notebook: a report naming it twice is not the cluster's.
    let mut seen = std::collections::BTreeSet::new();
    notebooks
        .iter()
        .find(|n| !seen.insert((n.namespace.as_str(), n.pod.as_str())))
        .map(|n| format!("notebooks: {}/{} is reported twice", n.namespace, n.pod))
}

/// A user's notebooks as the service answers them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Notebooks {
    /// Whose notebooks these are.
    pub user: String,
    /// When the controller last reported the cluster's notebooks; null: never
    /// (then nothing is known of any pod, which is not the same as none running).
    #[serde(default)]
    pub reported_at: Option<DateTime<Utc>>,
    /// The user's running notebooks, by namespace and pod name.
    pub notebooks: Vec<Notebook>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_pod_reported_twice_is_refused() {
        let mut other = notebook();
        other.user = "bob".into();
        assert_eq!(
            notebooks_problem(&[notebook(), other]),
            Some("notebooks: jhub/jupyter-alice is reported twice".into())
        );
        let mut elsewhere = notebook();
        elsewhere.namespace = "research".into();
        assert_eq!(notebooks_problem(&[notebook(), elsewhere]), None);
    }

    fn notebook() -> Notebook {
        serde_json::from_value(json!({
            "user": "alice", "namespace": "jhub", "pod": "jupyter-alice",
            "standing": "stripped", "why": "no free a100 GPU and no active booking",
            "next": ["book"]
        }))
        .unwrap()
    }

    #[test]
    fn a_notebook_reads_with_only_what_it_needs() {
        let n = notebook();
        assert_eq!((n.model, n.gpus, n.ends_at), (None, 0, None));
        assert_eq!(n.next, vec![NextStep::Book]);
        assert_eq!(notebooks_problem(&[notebook()]), None);
    }

    #[test]
    fn a_notebook_is_bounded_and_one_line() {
        let with = |f: &dyn Fn(&mut Notebook)| {
            let mut n = notebook();
            f(&mut n);
            n.problem()
        };
        assert!(with(&|n| n.user.clear()).is_some());
        assert!(with(&|n| n.pod = "p".repeat(MAX_NOTEBOOK_NAME_LEN + 1)).is_some());
        assert!(with(&|n| n.namespace = "a\nb".into()).is_some());
        assert!(with(&|n| n.why = "two\nlines".into()).is_some());
        assert!(with(&|n| n.why = "é".repeat(MAX_WHY_LEN + 1)).is_some());
        assert_eq!(with(&|n| n.why = "é".repeat(MAX_WHY_LEN)), None);
        assert!(with(&|n| n.gpus = -1).is_some());
        assert!(with(&|n| n.model = Some(String::new())).is_some());
        assert!(with(&|n| n.next = vec![NextStep::Book; 9]).is_some());
    }

    #[test]
    fn unknown_fields_and_standings_are_refused() {
        let mut v = serde_json::to_value(notebook()).unwrap();
        v["standing"] = json!("borrowed");
        assert!(serde_json::from_value::<Notebook>(v).is_err());
        let mut v = serde_json::to_value(notebook()).unwrap();
        v["extra"] = json!(1);
        assert!(serde_json::from_value::<Notebook>(v).is_err());
    }
}
