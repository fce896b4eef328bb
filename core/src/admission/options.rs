//! The admission options that the webhook and the controller share (with the `clap`
//! feature): which resources are GPUs, the keys the patch planner writes and the
//! priority classes. Defined once and flattened into both commands
//! (`#[command(flatten)]`), so that the two cannot disagree by a typo in one of them;
//! the environment variables carry no component name (`GPU_BOOKING_GPU_RESOURCE`, ...).
//! The priority classes are a group of their own ([`PriorityClassArgs`]) that the node
//! agent flattens too: it spares booked pods, and believes a pod booked as the
//! controller does, by our high class.

use clap::Args;

use super::{
    AdmissionConfig, DEFAULT_GPUMEM_RESOURCE, DEFAULT_GPU_RESOURCE, DEFAULT_HIGH_PRIORITY_CLASS,
    DEFAULT_LOW_PRIORITY_CLASS, DEFAULT_MODEL_NODE_LABEL, DEFAULT_TERMINATE_AT_ANNOTATION,
};

/// How pods are read and marked; must be the same in the webhook and the controller.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct AdmissionArgs {
    /// Generic GPU resources (any model); repeat or separate with commas.
    #[arg(long, env = "GPU_BOOKING_GPU_RESOURCE", value_delimiter = ',', default_value = DEFAULT_GPU_RESOURCE)]
    pub gpu_resource: Vec<String>,

    /// Extended resource that carries the VRAM budget in MiB (removed with the GPU).
    #[arg(long, env = "GPU_BOOKING_GPUMEM_RESOURCE", default_value = DEFAULT_GPUMEM_RESOURCE)]
    pub gpumem_resource: String,

    /// Annotation that carries a booked pod's end (RFC 3339, UTC): written by the
    /// webhook, acted on by the controller.
    #[arg(long, env = "GPU_BOOKING_TERMINATE_AT_ANNOTATION", default_value = DEFAULT_TERMINATE_AT_ANNOTATION)]
    pub terminate_at_annotation: String,

    /// Node label whose value is a model name: the controller labels GPU nodes with
    /// it, booked and lent pods get it as node selector (a node selector on
    /// nvidia.com/gpu.product cannot express a model that several products map to).
    #[arg(long, env = "GPU_BOOKING_MODEL_NODE_LABEL", default_value = DEFAULT_MODEL_NODE_LABEL)]
    pub model_node_label: String,

    // `--high-priority-class`, `--low-priority-class`.
    #[command(flatten)]
    pub priority_classes: PriorityClassArgs,
}

/// Our priority classes: the webhook gives them, the controller and the node agent
/// believe a pod booked only with the high one. Must be the same in all three.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct PriorityClassArgs {
    /// Priority class of booked pods ("" leaves the class alone); dropped from the
    /// controller's copies.
    #[arg(long, env = "GPU_BOOKING_HIGH_PRIORITY_CLASS", default_value = DEFAULT_HIGH_PRIORITY_CLASS)]
    pub high_priority_class: String,

    /// Priority class of pods that got a GPU without a booking ("" leaves it alone);
    /// dropped from the controller's CPU-only copies.
    #[arg(long, env = "GPU_BOOKING_LOW_PRIORITY_CLASS", default_value = DEFAULT_LOW_PRIORITY_CLASS)]
    pub low_priority_class: String,
}

impl Default for PriorityClassArgs {
    fn default() -> Self {
        Self {
            high_priority_class: DEFAULT_HIGH_PRIORITY_CLASS.to_owned(),
            low_priority_class: DEFAULT_LOW_PRIORITY_CLASS.to_owned(),
        }
    }
}

impl PriorityClassArgs {
    /// `config` with these classes ("" is none).
    pub fn apply(&self, config: AdmissionConfig) -> AdmissionConfig {
        let class = |c: &str| (!c.is_empty()).then(|| c.to_owned());
        AdmissionConfig {
            high_priority_class: class(&self.high_priority_class),
            low_priority_class: class(&self.low_priority_class),
            ..config
        }
    }
}

impl Default for AdmissionArgs {
    /// Every option at its default, as parsing nothing gives.
    fn default() -> Self {
        Self {
            gpu_resource: vec![DEFAULT_GPU_RESOURCE.to_owned()],
            gpumem_resource: DEFAULT_GPUMEM_RESOURCE.to_owned(),
            terminate_at_annotation: DEFAULT_TERMINATE_AT_ANNOTATION.to_owned(),
            model_node_label: DEFAULT_MODEL_NODE_LABEL.to_owned(),
            priority_classes: PriorityClassArgs::default(),
        }
    }
}

impl AdmissionArgs {
    /// The admission configuration with these options, the rest at its defaults (the
    /// webhook sets its own options over it); not yet validated.
    pub fn admission_config(&self) -> AdmissionConfig {
        self.priority_classes.apply(AdmissionConfig {
            gpu_resources: self.gpu_resource.clone(),
            gpumem_resource: self.gpumem_resource.clone(),
            terminate_at_annotation: self.terminate_at_annotation.clone(),
            model_node_label: self.model_node_label.clone(),
            ..AdmissionConfig::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        admission: AdmissionArgs,
    }

    #[test]
    fn defaults_are_the_configs_defaults() {
        let cli = Cli::try_parse_from(["x"]).unwrap();
        assert_eq!(cli.admission, AdmissionArgs::default());
        assert_eq!(cli.admission.admission_config(), AdmissionConfig::default());
    }

    #[test]
    fn options_reach_the_config() {
        let cli = Cli::try_parse_from([
            "x",
            "--gpu-resource=nvidia.com/gpu,example.com/gpu",
            "--low-priority-class=",
            "--terminate-at-annotation=example.com/end",
        ])
        .unwrap();
        let cfg = cli.admission.admission_config();
        assert_eq!(cfg.gpu_resources, ["nvidia.com/gpu", "example.com/gpu"]);
        assert_eq!(cfg.low_priority_class, None);
        assert_eq!(cfg.high_priority_class.as_deref(), Some("gpu-booking-high"));
        assert_eq!(cfg.terminate_at_annotation, "example.com/end");
        assert_eq!(cfg.validate(), Ok(()));
    }

    #[test]
    fn the_priority_classes_alone_read_the_same_variables() {
        #[derive(Parser)]
        struct Agent {
            #[command(flatten)]
            classes: PriorityClassArgs,
        }
        let names = |cmd: clap::Command| -> Vec<(String, String)> {
            cmd.get_arguments()
                .filter(|a| a.get_long().is_some_and(|l| l.ends_with("priority-class")))
                .map(|a| {
                    let env = a.get_env().map(|e| e.to_string_lossy().into_owned());
                    (
                        a.get_long().unwrap_or_default().to_owned(),
                        env.unwrap_or_default(),
                    )
                })
                .collect()
        };
        use clap::CommandFactory;
        assert_eq!(names(Cli::command()), names(Agent::command()));
        assert_eq!(names(Agent::command()).len(), 2);
        let agent = Agent::try_parse_from(["x", "--high-priority-class=lab-booked"]).unwrap();
        let cfg = agent.classes.apply(AdmissionConfig::default());
        assert_eq!(cfg.high_priority_class.as_deref(), Some("lab-booked"));
        assert_eq!(cfg.low_priority_class.as_deref(), Some("gpu-booking-low"));
    }
}
