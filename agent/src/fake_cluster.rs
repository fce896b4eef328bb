//! An in-memory fake of the Kubernetes calls the agent makes: a list of pods the test
//! sets, and a record of the annotations and Events the agent wrote.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use k8s_openapi::api::core::v1::Pod;

use crate::cluster::{BoxFuture, Cluster, ClusterError, PodEvent};
use crate::pods::PodInfo;

/// An annotation the agent set: `(namespace/name, key, value)`.
pub type Annotation = (String, String, String);

#[derive(Default)]
pub struct FakeCluster {
    pods: Mutex<Vec<Pod>>,
    annotations: Mutex<Vec<Annotation>>,
    events: Mutex<Vec<(String, PodEvent)>>,
    lists: AtomicUsize,
    failing: AtomicBool,
}

impl FakeCluster {
    pub fn new(pods: Vec<Pod>) -> Self {
        Self {
            pods: Mutex::new(pods),
            ..Default::default()
        }
    }

    pub fn set_pods(&self, pods: Vec<Pod>) {
        *self.pods.lock().unwrap_or_else(|e| e.into_inner()) = pods;
    }

    /// Every call fails until set back (an API server that is down).
    pub fn set_failing(&self, failing: bool) {
        self.failing.store(failing, Ordering::SeqCst);
    }

    /// How many times the pods were listed.
    pub fn lists(&self) -> usize {
        self.lists.load(Ordering::SeqCst)
    }

    pub fn annotations(&self) -> Vec<Annotation> {
        self.annotations
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// `(namespace/name, event)` in the order recorded.
    pub fn events(&self) -> Vec<(String, PodEvent)> {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn check(&self) -> Result<(), ClusterError> {
        if self.failing.load(Ordering::SeqCst) {
            Err(ClusterError("fake API server is down".into()))
        } else {
            Ok(())
        }
    }
}

impl Cluster for FakeCluster {
    fn node_pods(&self) -> BoxFuture<'_, Result<Vec<Pod>, ClusterError>> {
        Box::pin(async move {
            self.check()?;
            self.lists.fetch_add(1, Ordering::SeqCst);
            Ok(self.pods.lock().unwrap_or_else(|e| e.into_inner()).clone())
        })
    }

    fn annotate_pod<'a>(
        &'a self,
        pod: &'a PodInfo,
        key: &'a str,
        value: &'a str,
    ) -> BoxFuture<'a, Result<(), ClusterError>> {
        Box::pin(async move {
            self.check()?;
            let mut pods = self.pods.lock().unwrap_or_else(|e| e.into_inner());
            let target = pods.iter_mut().find(|p| {
                p.metadata.uid.as_deref().map(str::to_ascii_lowercase) == Some(pod.uid.clone())
            });
            let Some(target) = target else {
                return Err(ClusterError(format!("pod {} not found", pod.key())));
            };
            target
                .metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(key.to_owned(), value.to_owned());
            self.annotations
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((pod.key(), key.to_owned(), value.to_owned()));
            Ok(())
        })
    }

    fn pod_event<'a>(
        &'a self,
        pod: &'a PodInfo,
        event: &'a PodEvent,
    ) -> BoxFuture<'a, Result<(), ClusterError>> {
        Box::pin(async move {
            self.check()?;
            self.events
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((pod.key(), event.clone()));
            Ok(())
        })
    }
}
