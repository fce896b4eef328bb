//! The lab's nodes, labelled as NVIDIA's gpu-feature-discovery labels them and with
//! the allocatable resources the kubelet and the NVIDIA device plugin report.
//!
//! Labels: `nvidia.com/gpu.product` (with `-SHARED` appended when the card is
//! time-sliced, as GFD does unless `renameByDefault` is set), `nvidia.com/gpu.count`
//! (physical cards), `nvidia.com/gpu.memory` (MiB per card), `nvidia.com/gpu.replicas`
//! and `nvidia.com/gpu.sharing-strategy`; with MIG (the `mixed` strategy)
//! `nvidia.com/mig.strategy` and `nvidia.com/mig-<profile>.count/.memory/.product`.
//! Allocatable `nvidia.com/gpu` is cards times replicas (what the device plugin
//! advertises under time-slicing); a MIG profile is its own resource
//! `nvidia.com/mig-<profile>`. No `gpumem`: advertising the VRAM budget is the
//! controller's job, and the simulation must show whether it does it.

use gpu_booking_fake_apiserver::NodeBuilder;
use k8s_openapi::api::core::v1::Node;

/// MIG slices of one node (GFD's `mixed` strategy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mig {
    /// The profile, e.g. `1g.5gb`.
    pub profile: String,
    /// Slices of this profile on the node.
    pub count: u32,
    /// MiB per slice.
    pub memory_mib: u64,
}

/// Cards of one model reached through a resource of their own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelCards {
    /// e.g. `nvidia.com/t4`.
    pub resource: String,
    pub product: String,
    pub count: u32,
    pub memory_mib: u64,
    /// Time-slicing replicas per card (1: not shared).
    pub replicas: u32,
}

/// One node of the simulated lab.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuNode {
    pub name: String,
    /// The product as NVML names it with spaces turned into `-`, e.g.
    /// `NVIDIA-A100-SXM4-40GB`; `None` for a CPU-only node.
    pub product: Option<String>,
    /// Physical cards.
    pub gpus: u32,
    /// MiB per card.
    pub memory_mib: u64,
    /// Time-slicing replicas per card (1: not shared).
    pub replicas: u32,
    pub mig: Option<Mig>,
    /// Cards of other models on the node, each model under a resource of its own
    /// (the device plugin's renaming, seed 001), besides the generic ones.
    pub own_resource_cards: Vec<ModelCards>,
    /// Allocatable CPU cores, memory (GiB) and pods.
    pub cpu: u32,
    pub memory_gib: u32,
    pub pods: u32,
}

impl GpuNode {
    /// A node with `gpus` whole cards of `product`, `memory_mib` each.
    pub fn gpu(name: &str, product: &str, gpus: u32, memory_mib: u64) -> Self {
        Self {
            name: name.to_owned(),
            product: Some(product.to_owned()),
            gpus,
            memory_mib,
            replicas: 1,
            mig: None,
            own_resource_cards: Vec::new(),
            cpu: 64,
            memory_gib: 512,
            pods: 110,
        }
    }

    /// A node without GPUs, where CPU-only notebooks run.
    pub fn cpu_only(name: &str) -> Self {
        Self {
            product: None,
            gpus: 0,
            memory_mib: 0,
            ..Self::gpu(name, "", 0, 0)
        }
    }

    /// Each card shared by `replicas` pods (NVIDIA device plugin time-slicing).
    pub fn time_sliced(mut self, replicas: u32) -> Self {
        self.replicas = replicas.max(1);
        self
    }

    /// The cards partitioned into `count` MIG slices of `profile`.
    pub fn mig(mut self, profile: &str, count: u32, memory_mib: u64) -> Self {
        self.mig = Some(Mig {
            profile: profile.to_owned(),
            count,
            memory_mib,
        });
        self
    }

    /// `count` cards of `product` besides the node's others, under `resource` (a
    /// node with cards of several models), labelled as the device plugin and GFD
    /// describe a renamed resource (`<resource>.count`, `.memory`, `.product`).
    pub fn with_cards(self, resource: &str, product: &str, count: u32, memory_mib: u64) -> Self {
        self.with_shared_cards(resource, product, count, memory_mib, 1)
    }

    /// [`Self::with_cards`], each card time-sliced into `replicas`: the device plugin
    /// advertises cards x replicas of `resource`, GFD labels `<resource>.replicas`.
    pub fn with_shared_cards(
        mut self,
        resource: &str,
        product: &str,
        count: u32,
        memory_mib: u64,
        replicas: u32,
    ) -> Self {
        self.own_resource_cards.push(ModelCards {
            resource: resource.to_owned(),
            product: product.to_owned(),
            count,
            memory_mib,
            replicas: replicas.max(1),
        });
        self
    }

    /// Allocatable CPU cores (the default is 64).
    pub fn cpus(mut self, cpu: u32) -> Self {
        self.cpu = cpu;
        self
    }

    /// The product label's value: `-SHARED` appended under time-slicing.
    pub fn product_label(&self) -> Option<String> {
        self.product.as_ref().map(|p| {
            if self.replicas > 1 {
                format!("{p}-SHARED")
            } else {
                p.clone()
            }
        })
    }

    /// Allocatable `nvidia.com/gpu`: cards times replicas (none when all are MIG).
    pub fn gpu_allocatable(&self) -> u32 {
        if self.mig.is_some() {
            0
        } else {
            self.gpus * self.replicas
        }
    }

    /// The Node object as the API server holds it once the kubelet, the device plugin
    /// and GFD have reported.
    pub fn to_node(&self) -> Node {
        self.builder().build()
    }

    /// The fake API server's node builder with this node's labels and allocatable.
    pub fn builder(&self) -> NodeBuilder {
        let mut node = NodeBuilder::new(&self.name)
            .label("kubernetes.io/os", "linux")
            .allocatable("cpu", &self.cpu.to_string())
            .allocatable("memory", &format!("{}Gi", self.memory_gib))
            .allocatable("pods", &self.pods.to_string());
        if let Some(product) = self.product_label() {
            let sharing = if self.replicas > 1 {
                "time-slicing"
            } else {
                "none"
            };
            node = node
                .label("nvidia.com/gpu.present", "true")
                .label("nvidia.com/gpu.product", &product)
                .label("nvidia.com/gpu.count", &self.gpus.to_string())
                .label("nvidia.com/gpu.memory", &self.memory_mib.to_string())
                .label("nvidia.com/gpu.replicas", &self.replicas.to_string())
                .label("nvidia.com/gpu.sharing-strategy", sharing)
                .allocatable("nvidia.com/gpu", &self.gpu_allocatable().to_string());
        }
        for cards in &self.own_resource_cards {
            let r = &cards.resource;
            node = node
                .label(&format!("{r}.count"), &cards.count.to_string())
                .label(&format!("{r}.memory"), &cards.memory_mib.to_string())
                .label(&format!("{r}.product"), &cards.product)
                .label(&format!("{r}.replicas"), &cards.replicas.to_string())
                .allocatable(r, &(cards.count * cards.replicas).to_string());
        }
        if let (Some(mig), Some(product)) = (&self.mig, &self.product) {
            let prefix = format!("nvidia.com/mig-{}", mig.profile);
            node = node
                .label("nvidia.com/mig.strategy", "mixed")
                .label(&format!("{prefix}.count"), &mig.count.to_string())
                .label(&format!("{prefix}.memory"), &mig.memory_mib.to_string())
                .label(
                    &format!("{prefix}.product"),
                    &format!("{product}-MIG-{}", mig.profile),
                )
                .allocatable(&prefix, &mig.count.to_string());
        }
        node
    }
}

/// The demo's lab, matching the seeded models: one node with two A100s (`a100`),
/// two nodes with two RTX A6000s each (`a6000`), and a CPU node.
pub fn demo_lab() -> Vec<GpuNode> {
    vec![
        GpuNode::gpu("gpu-a100-0", "NVIDIA-A100-SXM4-40GB", 2, 40960),
        GpuNode::gpu("gpu-a6000-0", "NVIDIA-RTX-A6000", 2, 49152),
        GpuNode::gpu("gpu-a6000-1", "NVIDIA-RTX-A6000", 2, 49152),
        GpuNode::cpu_only("cpu-0"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(node: &Node) -> std::collections::BTreeMap<String, String> {
        node.metadata.labels.clone().unwrap_or_default()
    }

    fn allocatable(node: &Node, key: &str) -> Option<String> {
        node.status
            .as_ref()?
            .allocatable
            .as_ref()?
            .get(key)
            .map(|q| q.0.clone())
    }

    #[test]
    fn whole_cards_are_labelled_as_gfd_does() {
        let node = GpuNode::gpu("n", "NVIDIA-A100-SXM4-40GB", 2, 40960).to_node();
        let l = labels(&node);
        assert_eq!(l["nvidia.com/gpu.product"], "NVIDIA-A100-SXM4-40GB");
        assert_eq!(l["nvidia.com/gpu.count"], "2");
        assert_eq!(l["nvidia.com/gpu.memory"], "40960");
        assert_eq!(l["nvidia.com/gpu.replicas"], "1");
        assert_eq!(allocatable(&node, "nvidia.com/gpu").as_deref(), Some("2"));
        assert_eq!(allocatable(&node, "gpu-booking.io/gpumem"), None);
    }

    #[test]
    fn time_sliced_cards_say_shared_and_advertise_replicas() {
        let node = GpuNode::gpu("n", "NVIDIA-RTX-A6000", 1, 49152)
            .time_sliced(4)
            .to_node();
        let l = labels(&node);
        assert_eq!(l["nvidia.com/gpu.product"], "NVIDIA-RTX-A6000-SHARED");
        assert_eq!(l["nvidia.com/gpu.count"], "1");
        assert_eq!(l["nvidia.com/gpu.replicas"], "4");
        assert_eq!(l["nvidia.com/gpu.sharing-strategy"], "time-slicing");
        assert_eq!(allocatable(&node, "nvidia.com/gpu").as_deref(), Some("4"));
    }

    #[test]
    fn mig_slices_are_their_own_resource() {
        let node = GpuNode::gpu("n", "NVIDIA-A100-SXM4-40GB", 1, 40960)
            .mig("1g.5gb", 7, 4864)
            .to_node();
        let l = labels(&node);
        assert_eq!(l["nvidia.com/mig.strategy"], "mixed");
        assert_eq!(l["nvidia.com/mig-1g.5gb.count"], "7");
        assert_eq!(
            l["nvidia.com/mig-1g.5gb.product"],
            "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"
        );
        assert_eq!(
            allocatable(&node, "nvidia.com/mig-1g.5gb").as_deref(),
            Some("7")
        );
        assert_eq!(allocatable(&node, "nvidia.com/gpu").as_deref(), Some("0"));
    }

    #[test]
    fn time_sliced_cards_under_their_own_resource_advertise_replicas() {
        let node = GpuNode::gpu("n", "NVIDIA-A100-SXM4-40GB", 2, 40960)
            .with_shared_cards("nvidia.com/t4", "Tesla-T4", 1, 15360, 4)
            .to_node();
        let l = labels(&node);
        assert_eq!(l["nvidia.com/t4.count"], "1");
        assert_eq!(l["nvidia.com/t4.replicas"], "4");
        assert_eq!(l["nvidia.com/t4.memory"], "15360");
        assert_eq!(allocatable(&node, "nvidia.com/t4").as_deref(), Some("4"));
        assert_eq!(allocatable(&node, "nvidia.com/gpu").as_deref(), Some("2"));
    }

    #[test]
    fn cpu_nodes_have_no_gpu_labels() {
        let node = GpuNode::cpu_only("c").to_node();
        assert!(!labels(&node).contains_key("nvidia.com/gpu.product"));
        assert_eq!(allocatable(&node, "nvidia.com/gpu"), None);
        assert_eq!(allocatable(&node, "cpu").as_deref(), Some("64"));
    }
}
