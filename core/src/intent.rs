//! The next step of a two-step action on a pod (end it, then put its replacement in its
//! place: a CPU-only copy, a lent copy, or the hub's restart), decided from what the
//! cluster holds under the pod's name now.
//!
//! A controller records the action's intent before the first step and may die at any
//! point after it; whichever replica leads next finishes it from here. Every step is
//! safe to repeat, and the replacement is made exactly once: it carries the same name,
//! so a second create fails (AlreadyExists) and a pod under that name with another uid
//! means the replacement (or the user's own new pod) is already there.

/// What the cluster holds under the pod's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodNow<'a> {
    /// No pod of that name.
    Absent,
    /// A pod of that name, with its uid and whether it is terminating.
    Present { uid: &'a str, terminating: bool },
}

/// What to do next for an intent recorded for the pod with `original_uid`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The original is still there and nobody ended it: end it (the first step).
    EndOriginal,
    /// The original is terminating: wait until it is gone (a same-name pod cannot be
    /// created before).
    AwaitGone,
    /// The original is gone and nothing took its name: put the replacement there.
    Replace,
    /// Another pod holds the name: the replacement exists (or the user started a new
    /// pod); the intent is done.
    Done,
}

/// The next step for the intent recorded for `original_uid`, given what holds the
/// pod's name now.
pub fn next_step(original_uid: &str, now: PodNow<'_>) -> Step {
    match now {
        PodNow::Absent => Step::Replace,
        PodNow::Present { uid, .. } if uid != original_uid => Step::Done,
        PodNow::Present {
            terminating: true, ..
        } => Step::AwaitGone,
        PodNow::Present {
            terminating: false, ..
        } => Step::EndOriginal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_state_has_one_step() {
        let original = |terminating| PodNow::Present {
            uid: "u-1",
            terminating,
        };
        assert_eq!(next_step("u-1", original(false)), Step::EndOriginal);
        assert_eq!(next_step("u-1", original(true)), Step::AwaitGone);
        assert_eq!(next_step("u-1", PodNow::Absent), Step::Replace);
        for terminating in [false, true] {
            let other = PodNow::Present {
                uid: "u-2",
                terminating,
            };
            assert_eq!(next_step("u-1", other), Step::Done);
        }
    }

    /// Driving the steps from any state reaches exactly one replacement: the
    /// replacement step runs once, and after it the name is held by another uid.
    #[test]
    fn replaces_exactly_once_from_any_state() {
        for start in 0..3 {
            // 0: original running, 1: terminating, 2: gone.
            let mut state = start;
            let mut created = 0;
            for _ in 0..10 {
                let now = match state {
                    0 => PodNow::Present {
                        uid: "u-1",
                        terminating: false,
                    },
                    1 => PodNow::Present {
                        uid: "u-1",
                        terminating: true,
                    },
                    2 => PodNow::Absent,
                    _ => PodNow::Present {
                        uid: "copy",
                        terminating: false,
                    },
                };
                match next_step("u-1", now) {
                    Step::EndOriginal => state = 1,
                    Step::AwaitGone => state = 2,
                    Step::Replace => {
                        created += 1;
                        state = 3;
                    }
                    Step::Done => break,
                }
            }
            assert_eq!(created, 1, "from state {start}");
        }
    }
}
