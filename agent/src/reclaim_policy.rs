//! Who may be reclaimed, and after how long: the idle rule (with per-namespace
//! overrides, e.g. looser for development namespaces), the opt-out annotation, the
//! namespace and label allowlists, the process-name allowlist, and booked pods. Pure.

use std::time::Duration;

use gpu_booking_core::admission::PodStanding;
use regex::Regex;

use crate::pods::PodInfo;
use crate::procfs::ProcessInfo;

/// The PRD's defaults (section 11).
pub const DEFAULT_IDLE_MINUTES: u32 = 30;
pub const DEFAULT_CONSECUTIVE_IDLE_SAMPLES: u32 = 30;
pub const DEFAULT_UTIL_THRESHOLD_PERCENT: u32 = 1;
pub const DEFAULT_OPT_OUT_ANNOTATION: &str = "gpu-reclaimer/enabled=false";
/// System NVIDIA processes that are never reclaimed (matched against the process
/// name, its `comm` and its command line).
pub const DEFAULT_PROCESS_ALLOWLIST: &str = r"^(nvidia-persistenced|nvidia-persiste|nvidia-cuda-mps-(control|server)|nvidia-cuda-mps|nv-hostengine|dcgm-exporter|dcgmi|nvidia-smi|nvidia-device-plugin|nvidia-device-pl|gpu-feature-discovery|gpu-feature-dis|nvidia-dcgm|dcgmproftester[0-9]*)$";

/// When a pod counts as idle long enough, and what then happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdleRule {
    pub enabled: bool,
    /// Idle time since the last activity before reclaim.
    pub idle_minutes: u32,
    /// Consecutive idle samples before reclaim (jitter guard: both must hold).
    pub idle_samples: u32,
    /// A process whose utilisation reaches this percent is active.
    pub util_threshold_percent: u32,
    pub dry_run: bool,
}

impl IdleRule {
    pub fn idle_window(&self) -> Duration {
        Duration::from_secs(u64::from(self.idle_minutes) * 60)
    }
}

/// A namespace name, or a prefix ending in `*` (`dev-*`), or `*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamePattern(String);

impl NamePattern {
    pub fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let stem = s.strip_suffix('*').unwrap_or(s);
        let valid = stem
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if s.is_empty() || s.len() > 63 || !valid {
            return Err(format!(
                "{s:?}: a namespace, or a prefix followed by * (lowercase letters, digits, -)"
            ));
        }
        Ok(Self(s.to_owned()))
    }

    pub fn matches(&self, namespace: &str) -> bool {
        match self.0.strip_suffix('*') {
            Some(prefix) => namespace.starts_with(prefix),
            None => self.0 == namespace,
        }
    }
}

/// `key` (present with any value) or `key=value`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelMatch {
    pub key: String,
    pub value: Option<String>,
}

impl LabelMatch {
    pub fn parse(s: &str) -> Result<Self, String> {
        let (key, value) = match s.split_once('=') {
            Some((k, v)) => (k.trim(), Some(v.trim().to_owned())),
            None => (s.trim(), None),
        };
        if key.is_empty() || key.len() > 317 || key.chars().any(|c| c.is_whitespace()) {
            return Err(format!("{s:?}: expected KEY or KEY=VALUE"));
        }
        Ok(Self {
            key: key.to_owned(),
            value,
        })
    }

    fn matches(&self, pod: &PodInfo) -> bool {
        match (pod.labels.get(&self.key), &self.value) {
            (Some(_), None) => true,
            (Some(v), Some(want)) => v == want,
            (None, _) => false,
        }
    }
}

/// Settings that differ for the namespaces a pattern names.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IdleOverride {
    pub enabled: Option<bool>,
    pub idle_minutes: Option<u32>,
    pub idle_samples: Option<u32>,
    pub util_threshold_percent: Option<u32>,
    pub dry_run: Option<bool>,
}

/// `--namespace-policy`: `PATTERN:key=value,key=value` with keys `enabled`,
/// `idle-minutes`, `idle-samples`, `util-threshold`, `dry-run`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespacePolicy {
    pub pattern: NamePattern,
    pub rule: IdleOverride,
}

impl NamespacePolicy {
    pub fn parse(s: &str) -> Result<Self, String> {
        let (pattern, settings) = s
            .split_once(':')
            .ok_or_else(|| format!("{s:?}: expected NAMESPACE:key=value,..."))?;
        let pattern = NamePattern::parse(pattern)?;
        let mut rule = IdleOverride::default();
        for setting in settings.split(',').map(str::trim).filter(|x| !x.is_empty()) {
            let (key, value) = setting
                .split_once('=')
                .ok_or_else(|| format!("{setting:?}: expected key=value"))?;
            let (key, value) = (key.trim(), value.trim());
            let number = || {
                value
                    .parse::<u32>()
                    .map_err(|_| format!("{key}={value:?}: expected a whole number"))
            };
            let flag = || match value {
                "true" => Ok(true),
                "false" => Ok(false),
                _ => Err(format!("{key}={value:?}: expected true or false")),
            };
            match key {
                "enabled" => rule.enabled = Some(flag()?),
                "dry-run" => rule.dry_run = Some(flag()?),
                "idle-minutes" => rule.idle_minutes = Some(number()?),
                "idle-samples" => rule.idle_samples = Some(number()?),
                "util-threshold" => rule.util_threshold_percent = Some(number()?),
                other => {
                    return Err(format!(
                        "{other:?}: unknown key (enabled, dry-run, idle-minutes, idle-samples, util-threshold)"
                    ))
                }
            }
        }
        let policy = Self { pattern, rule };
        let base = IdleRule {
            enabled: true,
            idle_minutes: 1,
            idle_samples: 1,
            util_threshold_percent: 1,
            dry_run: false,
        };
        policy.apply(base, Duration::from_secs(60)).validate()?;
        Ok(policy)
    }

    /// The namespace's rule over `base`. A namespace that sets its idle minutes but
    /// not its sample count gets the count that fills those minutes at `interval`.
    fn apply(&self, base: IdleRule, interval: Duration) -> IdleRule {
        let r = &self.rule;
        let idle_samples = match (r.idle_samples, r.idle_minutes) {
            (Some(n), _) => n,
            (None, Some(minutes)) => samples_for(minutes, interval),
            (None, None) => base.idle_samples,
        };
        IdleRule {
            enabled: r.enabled.unwrap_or(base.enabled),
            idle_minutes: r.idle_minutes.unwrap_or(base.idle_minutes),
            idle_samples,
            util_threshold_percent: r
                .util_threshold_percent
                .unwrap_or(base.util_threshold_percent),
            dry_run: r.dry_run.unwrap_or(base.dry_run),
        }
    }
}

impl IdleRule {
    pub fn validate(&self) -> Result<(), String> {
        if self.idle_minutes == 0 || self.idle_minutes > 7 * 24 * 60 {
            return Err("idle minutes must be 1 to 10080".into());
        }
        if self.idle_samples == 0 || self.idle_samples > 100_000 {
            return Err("consecutive idle samples must be 1 to 100000".into());
        }
        if !(1..=100).contains(&self.util_threshold_percent) {
            return Err("the utilisation threshold must be 1 to 100 percent".into());
        }
        Ok(())
    }
}

/// Why a pod is never touched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exemption {
    OptOut,
    NamespaceAllowlist,
    LabelAllowlist,
    /// A pod that holds its booking's units (idle reclaim only).
    Booked,
}

impl Exemption {
    pub fn as_str(self) -> &'static str {
        match self {
            Exemption::OptOut => "opt_out",
            Exemption::NamespaceAllowlist => "namespace_allowlist",
            Exemption::LabelAllowlist => "label_allowlist",
            Exemption::Booked => "booked",
        }
    }
}

/// The number of samples taken in `minutes` at `interval` (at least 1): the
/// consecutive-idle-samples count that matches an idle window (the PRD's 30 minutes at
/// 60 s are 30 samples).
pub fn samples_for(minutes: u32, interval: Duration) -> u32 {
    let interval = interval.as_secs_f64().max(0.001);
    let n = (f64::from(minutes) * 60.0 / interval).ceil();
    n.clamp(1.0, f64::from(u32::MAX)) as u32
}

/// Everything that decides who may be acted on.
#[derive(Debug, Clone)]
pub struct Policy {
    pub idle: IdleRule,
    /// First match wins.
    pub namespace_policies: Vec<NamespacePolicy>,
    pub namespace_allowlist: Vec<NamePattern>,
    pub label_allowlist: Vec<LabelMatch>,
    pub process_allowlist: Option<Regex>,
    /// Annotation key and the value that opts a pod out of idle reclaim.
    pub opt_out: (String, String),
    /// The sample interval, for namespaces that set idle minutes without a count.
    pub sample_interval: Duration,
    /// Idle reclaim ends booked pods' GPU processes too. Off by default: a booking
    /// gives its user the card for the booking's time, used or idle, and ending
    /// their idle kernel would cost them its state.
    pub reclaim_booked_pods: bool,
}

impl Policy {
    /// The PRD's defaults.
    pub fn defaults() -> Self {
        Self {
            idle: IdleRule {
                enabled: true,
                idle_minutes: DEFAULT_IDLE_MINUTES,
                idle_samples: DEFAULT_CONSECUTIVE_IDLE_SAMPLES,
                util_threshold_percent: DEFAULT_UTIL_THRESHOLD_PERCENT,
                dry_run: false,
            },
            namespace_policies: Vec::new(),
            namespace_allowlist: vec![NamePattern("kube-system".into())],
            label_allowlist: Vec::new(),
            process_allowlist: Regex::new(DEFAULT_PROCESS_ALLOWLIST).ok(),
            sample_interval: Duration::from_secs(60),
            opt_out: parse_opt_out(DEFAULT_OPT_OUT_ANNOTATION)
                .unwrap_or_else(|_| ("gpu-reclaimer/enabled".into(), "false".into())),
            reclaim_booked_pods: false,
        }
    }

    /// The idle rule of a namespace.
    pub fn idle_rule(&self, namespace: &str) -> IdleRule {
        self.namespace_policies
            .iter()
            .find(|p| p.pattern.matches(namespace))
            .map_or(self.idle, |p| p.apply(self.idle, self.sample_interval))
    }

    /// Why the pod may never be touched by anything (allowlists), if so.
    pub fn allowlisted(&self, pod: &PodInfo) -> Option<Exemption> {
        if self
            .namespace_allowlist
            .iter()
            .any(|p| p.matches(&pod.namespace))
        {
            return Some(Exemption::NamespaceAllowlist);
        }
        if self.label_allowlist.iter().any(|l| l.matches(pod)) {
            return Some(Exemption::LabelAllowlist);
        }
        None
    }

    /// Why the pod is exempt from idle reclaim, if so (allowlists, opt-out, and a
    /// booked pod unless booked pods are reclaimed too). The VRAM watchdog knows
    /// only [`Self::allowlisted`]: a booked pod keeps to its budget like any other.
    pub fn idle_exemption(&self, pod: &PodInfo) -> Option<Exemption> {
        if let Some(e) = self.allowlisted(pod) {
            return Some(e);
        }
        let (key, value) = &self.opt_out;
        if pod
            .annotations
            .get(key)
            .is_some_and(|v| v.trim().eq_ignore_ascii_case(value))
        {
            return Some(Exemption::OptOut);
        }
        if !self.reclaim_booked_pods && pod.standing == Some(PodStanding::High) {
            return Some(Exemption::Booked);
        }
        None
    }

    /// Whether the process is a system process that is never reclaimed.
    pub fn process_allowlisted(&self, p: &ProcessInfo) -> bool {
        self.process_allowlist.as_ref().is_some_and(|re| {
            re.is_match(&p.name) || re.is_match(&p.comm) || re.is_match(&p.cmdline)
        })
    }
}

/// `KEY=VALUE` (the PRD's `POD_OPT_OUT_ANNOTATION`).
pub fn parse_opt_out(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected KEY=VALUE, e.g. gpu-reclaimer/enabled=false"))?;
    let (k, v) = (k.trim(), v.trim());
    if k.is_empty() || v.is_empty() {
        return Err(format!("{s:?}: expected KEY=VALUE"));
    }
    Ok((k.to_owned(), v.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::Unattributed;

    fn pod(ns: &str, labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> PodInfo {
        PodInfo {
            uid: "u".into(),
            namespace: ns.into(),
            name: "p".into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            annotations: annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            containers: vec![],
            gpumem_budget_mib: None,
            standing: None,
        }
    }

    fn process(name: &str, cmdline: &str) -> ProcessInfo {
        ProcessInfo {
            pid: 1,
            start_time: 1,
            comm: name.chars().take(15).collect(),
            name: name.into(),
            cmdline: cmdline.into(),
            container: Err(Unattributed::NotInPod),
        }
    }

    #[test]
    fn exemptions() {
        let mut policy = Policy::defaults();
        policy.label_allowlist = vec![
            LabelMatch::parse("tier=critical").unwrap(),
            LabelMatch::parse("keep-gpu").unwrap(),
        ];
        policy
            .namespace_allowlist
            .push(NamePattern::parse("infer-*").unwrap());
        assert_eq!(policy.idle_exemption(&pod("jhub", &[], &[])), None);
        assert_eq!(
            policy.idle_exemption(&pod("jhub", &[], &[("gpu-reclaimer/enabled", "False")])),
            Some(Exemption::OptOut)
        );
        assert_eq!(
            policy.idle_exemption(&pod("jhub", &[], &[("gpu-reclaimer/enabled", "true")])),
            None
        );
        assert_eq!(
            policy.idle_exemption(&pod("kube-system", &[], &[])),
            Some(Exemption::NamespaceAllowlist)
        );
        assert_eq!(
            policy.idle_exemption(&pod("infer-prod", &[], &[])),
            Some(Exemption::NamespaceAllowlist)
        );
        assert_eq!(
            policy.idle_exemption(&pod("jhub", &[("tier", "critical")], &[])),
            Some(Exemption::LabelAllowlist)
        );
        assert_eq!(
            policy.idle_exemption(&pod("jhub", &[("tier", "batch")], &[])),
            None
        );
        assert_eq!(
            policy.idle_exemption(&pod("jhub", &[("keep-gpu", "")], &[])),
            Some(Exemption::LabelAllowlist)
        );
        // The watchdog ignores the opt-out.
        assert_eq!(
            policy.allowlisted(&pod("jhub", &[], &[("gpu-reclaimer/enabled", "false")])),
            None
        );
    }

    #[test]
    fn booked_pods_are_spared_idle_reclaim_unless_told_otherwise() {
        let mut policy = Policy::defaults();
        let booked = PodInfo {
            standing: Some(PodStanding::High),
            ..pod("jhub", &[], &[])
        };
        let lent = PodInfo {
            standing: Some(PodStanding::Low),
            ..pod("jhub", &[], &[])
        };
        assert_eq!(policy.idle_exemption(&booked), Some(Exemption::Booked));
        assert_eq!(policy.idle_exemption(&lent), None);
        // The watchdog's rule does not spare it.
        assert_eq!(policy.allowlisted(&booked), None);
        policy.reclaim_booked_pods = true;
        assert_eq!(policy.idle_exemption(&booked), None);
    }

    #[test]
    fn namespace_policies() {
        let mut policy = Policy::defaults();
        policy.namespace_policies = vec![
            NamespacePolicy::parse("dev-*:idle-minutes=120,idle-samples=120").unwrap(),
            NamespacePolicy::parse("inference:idle-minutes=10, idle-samples=10,dry-run=true")
                .unwrap(),
            NamespacePolicy::parse("lab:enabled=false").unwrap(),
        ];
        let dev = policy.idle_rule("dev-alice");
        assert_eq!((dev.idle_minutes, dev.idle_samples), (120, 120));
        // Minutes alone: the count follows them.
        policy.namespace_policies[0] = NamespacePolicy::parse("dev-*:idle-minutes=90").unwrap();
        assert_eq!(policy.idle_rule("dev-alice").idle_samples, 90);
        policy.sample_interval = Duration::from_secs(30);
        assert_eq!(policy.idle_rule("dev-alice").idle_samples, 180);
        assert_eq!(samples_for(30, Duration::from_secs(60)), 30);
        assert_eq!(samples_for(1, Duration::from_secs(7)), 9);
        assert_eq!(samples_for(1, Duration::from_secs(3600)), 1);
        assert_eq!(dev.util_threshold_percent, 1);
        let inf = policy.idle_rule("inference");
        assert_eq!((inf.idle_minutes, inf.dry_run), (10, true));
        assert!(!policy.idle_rule("lab").enabled);
        assert_eq!(policy.idle_rule("jhub"), policy.idle);
        for bad in [
            "dev",
            "Dev:idle-minutes=1",
            "dev:idle-minutes=0",
            "dev:idle-minutes=x",
            "dev:speed=1",
            "dev:dry-run=yes",
            "dev:util-threshold=101",
            ":idle-minutes=1",
        ] {
            assert!(NamespacePolicy::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn system_processes_are_allowlisted() {
        let policy = Policy::defaults();
        for (name, cmd) in [
            (
                "nvidia-persistenced",
                "/usr/bin/nvidia-persistenced --user nvidia",
            ),
            ("nv-hostengine", "nv-hostengine -n"),
            ("dcgm-exporter", "/usr/bin/dcgm-exporter -f /etc/dcgm.csv"),
            ("nvidia-cuda-mps-server", ""),
        ] {
            assert!(policy.process_allowlisted(&process(name, cmd)), "{name}");
        }
        for (name, cmd) in [
            ("python3", "python3 -m ipykernel_launcher -f /tmp/k.json"),
            ("nvidia-smi-wrapper", "x"),
        ] {
            assert!(!policy.process_allowlisted(&process(name, cmd)), "{name}");
        }
    }

    #[test]
    fn opt_out_and_patterns() {
        assert_eq!(
            parse_opt_out("a/b=no").unwrap(),
            ("a/b".to_owned(), "no".to_owned())
        );
        assert!(parse_opt_out("a/b").is_err());
        assert!(parse_opt_out("=x").is_err());
        assert!(NamePattern::parse("*").unwrap().matches("anything"));
        assert!(NamePattern::parse("a b").is_err());
        assert!(LabelMatch::parse("").is_err());
    }
}
