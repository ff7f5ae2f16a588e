//! The RBAC the driver needs, as the fake API server sees it: every request
//! a component's client makes is mapped to the verb and resource the API
//! server's authorizer checks, under the chart role that component's calls
//! are granted by. Each fake checks its needs against the committed record,
//! `deploy/rbac-needs.txt`, when it goes (a new call fails its tests until
//! the record and the chart have it); with `LOCALVOL_RBAC_RECORD=<file>` it
//! appends them to that file instead, from which `make rbac-needs` writes
//! the record and `make unit` finds a stale one. `deploy/validate` holds the
//! chart's roles to the record.

use std::collections::BTreeSet;
use std::io::Write;

use http::{Method, Uri};

/// The environment variable naming the file a recording run appends to.
pub const RECORD_ENV: &str = "LOCALVOL_RBAC_RECORD";

/// The committed record, one need a line (`#` lines are comments).
const COMMITTED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/rbac-needs.txt");

/// The namespace of the fake's clients: the driver's own (`POD_NAMESPACE`,
/// its `--namespace` and `--lease-namespace`), where the chart grants with
/// a Role. A request in any other namespace, or for a cluster-scoped
/// resource, needs the ClusterRole.
pub const NAMESPACE: &str = "kube-system";

/// The chart's roles for localvol's own calls (the suffixes of their
/// ClusterRole and Role names): whose client a request came on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// `localvol controller` (src/controller/).
    Controller,
    /// `localvol serve` with discovery or orphans (src/discovery/,
    /// src/orphans.rs).
    Discovery,
    /// ControllerExpandVolume's reads (src/k8s/room.rs).
    Expansion,
    /// An LVM node's VolumeAttributesClasses (src/attributes.rs).
    Attributes,
    /// Every node plugin: its storage identity and pool Events
    /// (src/k8s/lost.rs, src/monitor.rs).
    Storage,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::Controller => "controller",
            Role::Discovery => "discovery",
            Role::Expansion => "expansion",
            Role::Attributes => "attributes",
            Role::Storage => "storage",
        }
    }
}

/// The need a request implies, as a record line: `<role> <ClusterRole|Role>
/// <apiGroup, core for ""> <resource[/subresource]> <verb>`, with the verb
/// the authorizer names; an error for a request it cannot name.
pub fn need(role: Role, method: &Method, uri: &Uri) -> Result<String, String> {
    let path = uri.path();
    let bad = || format!("{method} {uri}: no RBAC need known for this request");
    let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let (group, rest) = match segs.as_slice() {
        ["api", "v1", rest @ ..] => ("core", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => return Err(bad()),
    };
    let (ns, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(*ns), rest),
        _ => (None, rest),
    };
    let (resource, named) = match rest {
        [r] => (r.to_string(), false),
        [r, _name] => (r.to_string(), true),
        [r, _name, sub] => (format!("{r}/{sub}"), true),
        _ => return Err(bad()),
    };
    let watch = uri
        .query()
        .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
    let verb = match (method.as_str(), named) {
        ("GET", true) => "get",
        ("GET", false) if watch => "watch",
        ("GET", false) => "list",
        ("POST", false) => "create",
        ("PUT", true) => "update",
        ("PATCH", true) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => return Err(bad()),
    };
    if resource.is_empty() || group.is_empty() {
        return Err(bad());
    }
    let kind = if ns == Some(NAMESPACE) {
        "Role"
    } else {
        "ClusterRole"
    };
    Ok(format!("{} {kind} {group} {resource} {verb}", role.name()))
}

/// What one fake's clients needed, and the requests no need was found for.
#[derive(Default)]
pub struct Needs {
    seen: BTreeSet<String>,
    unmapped: Vec<String>,
}

impl Needs {
    /// Notes the request's need; false when it has none (the fake answers
    /// 500, and the test fails when the fake goes).
    pub fn note(&mut self, role: Role, method: &Method, uri: &Uri) -> bool {
        match need(role, method, uri) {
            Ok(n) => {
                self.seen.insert(n);
                true
            }
            Err(e) => {
                self.unmapped.push(e);
                false
            }
        }
    }

    /// The needs noted so far.
    pub fn seen(&self) -> impl Iterator<Item = &String> {
        self.seen.iter()
    }

    /// When the fake goes: appends the needs to the recording file if one
    /// is named, else fails the test on a need the committed record lacks;
    /// and on any request that had no need.
    pub fn finish(&self) {
        assert!(self.unmapped.is_empty(), "{:?}", self.unmapped);
        if let Ok(path) = std::env::var(RECORD_ENV) {
            append(&path, &self.seen);
            return;
        }
        let text = std::fs::read_to_string(COMMITTED).expect(COMMITTED);
        let committed: BTreeSet<&str> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .collect();
        let missing: Vec<&String> = self
            .seen
            .iter()
            .filter(|n| !committed.contains(n.as_str()))
            .collect();
        assert!(
            missing.is_empty(),
            "RBAC needs not in deploy/rbac-needs.txt: {missing:?}; grant them in the chart and run `make rbac-needs`"
        );
    }
}

/// Appends `needs` to `path` in one write (O_APPEND: whole lines even with
/// the tests' threads appending at once).
fn append(path: &str, needs: &BTreeSet<String>) {
    let text: String = needs.iter().map(|n| format!("{n}\n")).collect();
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    f.write_all(text.as_bytes())
        .unwrap_or_else(|e| panic!("{path}: {e}"));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(method: &str, uri: &str) -> Result<String, String> {
        need(
            Role::Controller,
            &method.parse().unwrap(),
            &uri.parse().unwrap(),
        )
    }

    #[test]
    fn requests_map_to_the_authorizers_verbs_and_scopes() {
        let ok = |m: &str, u: &str| n(m, u).unwrap();
        assert_eq!(
            ok("GET", "/api/v1/persistentvolumes/pv-a"),
            "controller ClusterRole core persistentvolumes get"
        );
        assert_eq!(
            ok("GET", "/api/v1/nodes?&watch=true&timeoutSeconds=290"),
            "controller ClusterRole core nodes watch"
        );
        assert_eq!(
            ok("GET", "/api/v1/nodes?labelSelector=a%3Db"),
            "controller ClusterRole core nodes list"
        );
        assert_eq!(
            ok(
                "POST",
                "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases"
            ),
            "controller Role coordination.k8s.io leases create"
        );
        assert_eq!(
            ok(
                "PATCH",
                "/api/v1/namespaces/app/persistentvolumeclaims/c/status"
            ),
            "controller ClusterRole core persistentvolumeclaims/status patch"
        );
        assert_eq!(
            ok("PUT", "/api/v1/namespaces/kube-system/configmaps/x"),
            "controller Role core configmaps update"
        );
        assert_eq!(
            ok("DELETE", "/api/v1/namespaces/app/persistentvolumeclaims"),
            "controller ClusterRole core persistentvolumeclaims deletecollection"
        );
        for (m, u) in [
            ("GET", "/version"),
            ("POST", "/api/v1/persistentvolumes/pv-a"),
            ("PUT", "/api/v1/persistentvolumes"),
            ("GET", "/api/v1/a/b/c/d"),
            ("OPTIONS", "/api/v1/nodes"),
        ] {
            assert!(n(m, u).is_err(), "{m} {u}");
        }
    }
}
