//! The admission configuration the controller acts on: the options it was started
//! with, plus the models' own resources as the booking service declares them
//! (`nvidia.com/a100` names the model `a100`). The event loop learns those; every
//! part reads the one current value, so that the pods the loop classifies and the
//! copies an action makes (a CPU-only copy strips every GPU resource, the models'
//! own included) follow the same configuration.

use std::sync::{Arc, RwLock};

use gpu_booking_core::admission::AdmissionConfig;
use gpu_booking_core::gpu_model::ModelName;

/// Shared by the event loop and the actions; cheap to clone.
#[derive(Debug, Clone)]
pub struct LiveConfig {
    /// As started (`--gpu-resource`, `--model-resource`, ...).
    base: Arc<AdmissionConfig>,
    current: Arc<RwLock<Arc<AdmissionConfig>>>,
}

impl LiveConfig {
    pub fn new(base: AdmissionConfig) -> Self {
        let base = Arc::new(base);
        Self {
            current: Arc::new(RwLock::new(base.clone())),
            base,
        }
    }

    /// The configuration now.
    pub fn current(&self) -> Arc<AdmissionConfig> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The models' resources (resource -> model) added to the options started with;
    /// true when that changed what a resource names.
    pub fn learn_model_resources<'a>(
        &self,
        resources: impl IntoIterator<Item = (&'a String, &'a String)>,
    ) -> bool {
        let mut next = (*self.base).clone();
        for (resource, model) in resources {
            if let Ok(name) = ModelName::parse(model) {
                next.model_resources.insert(resource.clone(), name);
            }
        }
        let mut current = self.current.write().unwrap_or_else(|e| e.into_inner());
        let changed = next.model_resources != current.model_resources;
        *current = Arc::new(next);
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn learned_resources_are_what_every_reader_sees() {
        let live = LiveConfig::new(AdmissionConfig::default());
        let reader = live.clone();
        let (resource, model) = ("nvidia.com/a100".to_owned(), "a100".to_owned());
        assert!(live.learn_model_resources([(&resource, &model)]));
        assert!(reader
            .current()
            .model_resources
            .contains_key("nvidia.com/a100"));
        assert!(
            !live.learn_model_resources([(&resource, &model)]),
            "unchanged"
        );
        assert!(
            live.learn_model_resources(std::iter::empty()),
            "the model went away"
        );
        assert!(reader.current().model_resources.is_empty());
    }
}
