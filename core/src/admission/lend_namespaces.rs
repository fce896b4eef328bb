//! Where a GPU pod without a trusted identity may be lent a card: only where the
//! controller can take the card back.
//!
//! A lent card is one a booked user may need: the controller takes it back by
//! ending the lent pod, and it acts only in the namespace it serves and deletes only
//! in the namespaces an admin made preemptible ([`crate::preemption_policy`]). A pod
//! lent a card anywhere else would keep it for good, and a booked user would wait on
//! it. So such a pod is not lent there: it is another workload, admitted as its
//! creator wrote it (`Decision::OtherWorkload`), which the controller counts as
//! holding its card like any workload bookings do not preempt.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

/// The namespaces in which the controller can take a lent card back.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LendNamespaces {
    /// Every namespace (`*`): the controller acts everywhere, which is also what
    /// it does by default (`--namespace` unset).
    #[default]
    Everywhere,
    /// These namespaces only.
    Only(BTreeSet<String>),
}

/// The name that stands for every namespace, as the controller's `--namespace` and
/// the chart's `controller.namespace` write it.
pub const EVERY_NAMESPACE: &str = "*";

impl LendNamespaces {
    /// From a list of names (`--lend-namespaces`): [`EVERY_NAMESPACE`] among them
    /// is every namespace; blank entries are dropped (an empty environment variable
    /// gives one). `None` when no name is left: a list that names nothing is a
    /// mistake, not "nowhere".
    pub fn from_names<S: AsRef<str>>(names: impl IntoIterator<Item = S>) -> Option<Self> {
        let mut only = BTreeSet::new();
        for name in names {
            let name = name.as_ref().trim();
            if name == EVERY_NAMESPACE {
                return Some(Self::Everywhere);
            }
            if !name.is_empty() {
                only.insert(name.to_owned());
            }
        }
        (!only.is_empty()).then_some(Self::Only(only))
    }

    /// Whether a pod created in `namespace` may be lent a card. A request without a
    /// namespace is in none of the named ones.
    pub fn contains(&self, namespace: Option<&str>) -> bool {
        match self {
            Self::Everywhere => true,
            Self::Only(names) => namespace.is_some_and(|ns| names.contains(ns)),
        }
    }

    /// The named namespaces (none for [`Self::Everywhere`]), for the checks of
    /// the configuration.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        let names = match self {
            Self::Everywhere => None,
            Self::Only(names) => Some(names),
        };
        names.into_iter().flatten().map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_star_is_every_namespace_and_a_list_only_its_names() {
        let only = LendNamespaces::from_names(["jhub", " research ", ""]).unwrap();
        assert!(only.contains(Some("jhub")) && only.contains(Some("research")));
        assert!(!only.contains(Some("batch")));
        assert!(!only.contains(None));
        assert_eq!(only.names().collect::<Vec<_>>(), ["jhub", "research"]);
        let every = LendNamespaces::from_names(["jhub", "*"]).unwrap();
        assert_eq!(every, LendNamespaces::Everywhere);
        assert!(every.contains(Some("batch")) && every.contains(None));
        assert_eq!(every.names().count(), 0);
        assert_eq!(LendNamespaces::default(), LendNamespaces::Everywhere);
        assert_eq!(LendNamespaces::from_names(["", " "]), None);
        assert_eq!(LendNamespaces::from_names(Vec::<String>::new()), None);
    }
}
