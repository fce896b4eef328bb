//! Which pod and container a process belongs to, from the text of
//! `/proc/<pid>/cgroup`. Pure: no I/O.
//!
//! The kubelet puts every container in a cgroup whose path names the pod UID and the
//! container ID. The shapes differ by cgroup driver and runtime:
//!
//! | driver | example path |
//! | --- | --- |
//! | systemd, containerd | `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_with_underscores>.slice/cri-containerd-<id>.scope` |
//! | systemd, CRI-O | `.../kubepods-besteffort-pod<uid>.slice/crio-<id>.scope` |
//! | systemd, docker (cri-dockerd) | `.../kubepods-pod<uid>.slice/docker-<id>.scope` |
//! | cgroupfs, any runtime | `/kubepods/burstable/pod<uid-with-dashes>/<id>` |
//!
//! cgroup v1 lists one line per hierarchy (`11:memory:/kubepods/...`), v2 one line
//! (`0::/kubepods.slice/...`); hybrid hosts have both. Inside a cgroup namespace the
//! path is relative and may start with `/../..`; kind-style nested clusters prefix
//! `kubelet.slice/kubelet-kubepods...`. So the parser looks for the pod segment
//! anywhere in the path and takes the segment after it as the container, and every
//! line that names a pod must name the same one. Anything else is not attributed:
//! the agent never acts on a guess.

use std::fmt;

/// The container runtime a cgroup path names, when it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Runtime {
    Containerd,
    CriO,
    Docker,
    /// A bare container ID (cgroupfs driver): the runtime is not in the path.
    Unnamed,
}

/// A process's pod UID (with dashes, as the API has it) and container ID (64 hex).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerRef {
    pub pod_uid: String,
    pub container_id: String,
    pub runtime: Runtime,
}

/// Why a cgroup file names no container.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Unattributed {
    /// No line names a Kubernetes pod (a host process, or a runtime we do not know).
    NotInPod,
    /// A pod, but no container below it (the pod-level cgroup itself).
    NoContainer,
    /// Lines that name different pods or containers.
    Conflicting,
}

impl Unattributed {
    pub fn as_str(self) -> &'static str {
        match self {
            Unattributed::NotInPod => "not_in_pod",
            Unattributed::NoContainer => "no_container",
            Unattributed::Conflicting => "conflicting_cgroups",
        }
    }
}

impl fmt::Display for Unattributed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The pod and container named by the text of a `/proc/<pid>/cgroup` file.
pub fn parse_cgroup(text: &str) -> Result<ContainerRef, Unattributed> {
    let mut found: Option<ContainerRef> = None;
    let mut pod_without_container = false;
    for line in text.lines() {
        // `hierarchy-ID:controller-list:path`; the path may itself contain ':'.
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(_), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        match parse_path(path) {
            PathMatch::None => {}
            PathMatch::PodOnly => pod_without_container = true,
            PathMatch::Container(c) => match &found {
                None => found = Some(c),
                Some(prev) if prev.pod_uid == c.pod_uid && prev.container_id == c.container_id => {}
                Some(_) => return Err(Unattributed::Conflicting),
            },
        }
    }
    match found {
        Some(c) => Ok(c),
        None if pod_without_container => Err(Unattributed::NoContainer),
        None => Err(Unattributed::NotInPod),
    }
}

enum PathMatch {
    None,
    PodOnly,
    Container(ContainerRef),
}

fn parse_path(path: &str) -> PathMatch {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    // The last pod segment wins: a nested cluster's outer pod comes first.
    let Some((at, uid)) = segments
        .iter()
        .enumerate()
        .rev()
        .find_map(|(i, s)| pod_uid_of_segment(s).map(|uid| (i, uid)))
    else {
        return PathMatch::None;
    };
    match segments.get(at + 1).and_then(|s| container_of_segment(s)) {
        Some((container_id, runtime)) => PathMatch::Container(ContainerRef {
            pod_uid: uid,
            container_id,
            runtime,
        }),
        None => PathMatch::PodOnly,
    }
}

/// `pod<uid>` (cgroupfs) or `...-pod<uid_with_underscores>.slice` (systemd).
fn pod_uid_of_segment(segment: &str) -> Option<String> {
    let raw = if let Some(slice) = segment.strip_suffix(".slice") {
        let (prefix, uid) = slice.rsplit_once("-pod")?;
        // `kubepods-pod...`, `kubepods-burstable-pod...`, `kubelet-kubepods-...-pod...`
        if !prefix.contains("kubepods") {
            return None;
        }
        uid
    } else {
        segment.strip_prefix("pod")?
    };
    normalise_uid(raw)
}

/// A UID as the API writes it (8-4-4-4-12 lowercase hex with dashes); systemd writes
/// `_` for `-`.
fn normalise_uid(raw: &str) -> Option<String> {
    let uid: String = raw
        .chars()
        .map(|c| if c == '_' { '-' } else { c })
        .collect();
    let groups: Vec<&str> = uid.split('-').collect();
    let shape_ok = groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()));
    shape_ok.then(|| uid.to_ascii_lowercase())
}

/// `cri-containerd-<id>.scope`, `crio-<id>.scope`, `docker-<id>.scope`, or a bare
/// `<id>` (cgroupfs). `crio-conmon-<id>.scope` is CRI-O's monitor, not the container.
fn container_of_segment(segment: &str) -> Option<(String, Runtime)> {
    let (id, runtime) = match segment.strip_suffix(".scope") {
        Some(scope) => {
            if let Some(id) = scope.strip_prefix("cri-containerd-") {
                (id, Runtime::Containerd)
            } else if let Some(id) = scope.strip_prefix("crio-") {
                (id, Runtime::CriO)
            } else if let Some(id) = scope.strip_prefix("docker-") {
                (id, Runtime::Docker)
            } else if let Some(id) = scope.strip_prefix("containerd-") {
                (id, Runtime::Containerd)
            } else {
                return None;
            }
        }
        None => (segment, Runtime::Unnamed),
    };
    is_container_id(id).then(|| (id.to_ascii_lowercase(), runtime))
}

fn is_container_id(id: &str) -> bool {
    id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The bare ID of a `containerStatuses[].containerID` (`containerd://<id>`,
/// `cri-o://<id>`, `docker://<id>`).
pub fn status_container_id(value: &str) -> Option<&str> {
    let id = value.split_once("://").map_or(value, |(_, id)| id);
    is_container_id(id).then_some(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "6b1c0f1e-2d3a-4b5c-8d9e-0a1b2c3d4e5f";
    const UID_: &str = "6b1c0f1e_2d3a_4b5c_8d9e_0a1b2c3d4e5f";
    const CID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn ok(text: &str, runtime: Runtime) {
        let got = parse_cgroup(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(
            got,
            ContainerRef {
                pod_uid: UID.into(),
                container_id: CID.into(),
                runtime
            },
            "{text}"
        );
    }

    #[test]
    fn v2_systemd_runtimes() {
        for qos in ["", "burstable-", "besteffort-"] {
            let slice = if qos.is_empty() {
                String::new()
            } else {
                format!("kubepods-{}.slice/", qos.trim_end_matches('-'))
            };
            for (scope, runtime) in [
                ("cri-containerd", Runtime::Containerd),
                ("crio", Runtime::CriO),
                ("docker", Runtime::Docker),
            ] {
                ok(
                    &format!("0::/kubepods.slice/{slice}kubepods-{qos}pod{UID_}.slice/{scope}-{CID}.scope\n"),
                    runtime,
                );
            }
        }
    }

    #[test]
    fn v2_cgroupfs() {
        ok(
            &format!("0::/kubepods/burstable/pod{UID}/{CID}\n"),
            Runtime::Unnamed,
        );
        ok(&format!("0::/kubepods/pod{UID}/{CID}"), Runtime::Unnamed);
    }

    #[test]
    fn v1_every_hierarchy_agrees() {
        let text = format!(
            "12:pids:/kubepods/besteffort/pod{UID}/{CID}\n\
             11:memory:/kubepods/besteffort/pod{UID}/{CID}\n\
             10:cpu,cpuacct:/kubepods/besteffort/pod{UID}/{CID}\n\
             1:name=systemd:/kubepods/besteffort/pod{UID}/{CID}\n"
        );
        ok(&text, Runtime::Unnamed);
        let text = format!(
            "11:devices:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope\n\
             0::/\n"
        );
        ok(&text, Runtime::Containerd);
    }

    #[test]
    fn namespaced_and_nested_paths() {
        // Read from inside a cgroup namespace.
        ok(
            &format!("0::/../../kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope"),
            Runtime::Containerd,
        );
        // kind: the node is itself a container.
        ok(
            &format!("0::/system.slice/docker-{}.scope/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope", "f".repeat(64)),
            Runtime::Containerd,
        );
        // A sub-cgroup inside the container still belongs to it.
        ok(
            &format!("0::/kubepods.slice/kubepods-pod{UID_}.slice/crio-{CID}.scope/container"),
            Runtime::CriO,
        );
    }

    #[test]
    fn not_attributed() {
        let cases = [
            ("0::/init.scope", Unattributed::NotInPod),
            (
                "0::/system.slice/nvidia-persistenced.service",
                Unattributed::NotInPod,
            ),
            (
                "0::/user.slice/user-1000.slice/session-3.scope",
                Unattributed::NotInPod,
            ),
            ("", Unattributed::NotInPod),
            ("garbage without colons", Unattributed::NotInPod),
            (&format!("0::/docker/{CID}") as &str, Unattributed::NotInPod),
        ];
        for (text, want) in cases {
            assert_eq!(parse_cgroup(text), Err(want), "{text}");
        }
        let pod_level = format!("0::/kubepods/burstable/pod{UID}");
        assert_eq!(parse_cgroup(&pod_level), Err(Unattributed::NoContainer));
        let conmon = format!("0::/kubepods.slice/kubepods-pod{UID_}.slice/crio-conmon-{CID}.scope");
        assert_eq!(parse_cgroup(&conmon), Err(Unattributed::NoContainer));
        let short = format!("0::/kubepods/pod{UID}/{}", &CID[..12]);
        assert_eq!(parse_cgroup(&short), Err(Unattributed::NoContainer));
        let bad_uid = format!("0::/kubepods/podnot-a-uid/{CID}");
        assert_eq!(parse_cgroup(&bad_uid), Err(Unattributed::NotInPod));
        let other = "f".repeat(64);
        let conflicting =
            format!("11:memory:/kubepods/pod{UID}/{CID}\n10:pids:/kubepods/pod{UID}/{other}\n");
        assert_eq!(parse_cgroup(&conflicting), Err(Unattributed::Conflicting));
    }

    #[test]
    fn uppercase_and_status_ids() {
        let upper = format!(
            "0::/kubepods/pod{}/{}",
            UID.to_uppercase(),
            CID.to_uppercase()
        );
        ok(&upper, Runtime::Unnamed);
        assert_eq!(
            status_container_id(&format!("containerd://{CID}")),
            Some(CID)
        );
        assert_eq!(status_container_id(&format!("cri-o://{CID}")), Some(CID));
        assert_eq!(status_container_id(&format!("docker://{CID}")), Some(CID));
        assert_eq!(status_container_id("containerd://short"), None);
        assert_eq!(status_container_id(""), None);
    }

    #[test]
    fn never_panics_on_odd_text() {
        for text in [
            ":::\n::\n:",
            "0::/kubepods/pod",
            "0::/kubepods-pod.slice",
            "0::/-pod.slice/x",
            "0::/kubepods/pod\u{e9}\u{e9}/\u{e9}",
            "0::////",
        ] {
            let _ = parse_cgroup(text);
        }
    }

    mod properties {
        use super::super::*;
        use proptest::prelude::*;

        fn uid() -> impl Strategy<Value = String> {
            "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
        }

        fn cid() -> impl Strategy<Value = String> {
            "[0-9a-f]{64}"
        }

        proptest! {
            /// Every kubelet path shape names its pod and container, whatever the
            /// QoS class, runtime, driver, cgroup version and namespace prefix.
            #[test]
            fn every_shape_is_attributed(
                uid in uid(),
                cid in cid(),
                qos in prop::sample::select(vec!["", "burstable", "besteffort"]),
                shape in 0usize..5,
                prefix in prop::sample::select(vec!["", "/../..", "/kubelet.slice/kubelet-kubepods.slice"]),
            ) {
                let u = uid.replace('-', "_");
                let (slice, qpod) = if qos.is_empty() {
                    (String::new(), "kubepods-pod".to_owned())
                } else {
                    (format!("kubepods-{qos}.slice/"), format!("kubepods-{qos}-pod"))
                };
                let qdir = if qos.is_empty() { String::new() } else { format!("{qos}/") };
                let text = match shape {
                    0 => format!("0::{prefix}/kubepods.slice/{slice}{qpod}{u}.slice/cri-containerd-{cid}.scope\n"),
                    1 => format!("0::{prefix}/kubepods.slice/{slice}{qpod}{u}.slice/crio-{cid}.scope\n"),
                    2 => format!("7:devices:{prefix}/kubepods.slice/{slice}{qpod}{u}.slice/docker-{cid}.scope\n0::/\n"),
                    3 => format!("11:memory:{prefix}/kubepods/{qdir}pod{uid}/{cid}\n5:pids:{prefix}/kubepods/{qdir}pod{uid}/{cid}\n"),
                    _ => format!("0::{prefix}/kubepods/{qdir}pod{uid}/{cid}\n"),
                };
                let got = parse_cgroup(&text).map_err(|e| TestCaseError::fail(format!("{text}: {e}")))?;
                prop_assert_eq!(got.pod_uid, uid);
                prop_assert_eq!(got.container_id, cid);
            }

            /// Any text: an answer, never a panic.
            #[test]
            fn never_panics(text in "(?s).{0,400}") {
                let _ = parse_cgroup(&text);
            }
        }
    }
}
