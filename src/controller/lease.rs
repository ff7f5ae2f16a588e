//! Leader election on a `coordination.k8s.io/v1` Lease: the holder renews it;
//! another replica takes it over only once it has expired. Writes use the
//! Lease's resourceVersion, so two replicas racing for it cannot both win.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, PostParams};
use kube::Client;

/// What to do with the Lease as found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// No Lease: create it, holding it.
    Create,
    /// Held by us: renew.
    Renew,
    /// Expired or released: take it over.
    Take,
    /// Held by another replica and not expired.
    Follow,
}

/// Decides from the Lease as read at `now`.
pub fn decide(lease: Option<&Lease>, me: &str, now: Timestamp) -> Step {
    let Some(spec) = lease.and_then(|l| l.spec.as_ref()) else {
        return if lease.is_none() {
            Step::Create
        } else {
            Step::Take
        };
    };
    match spec.holder_identity.as_deref() {
        Some(h) if h == me => return Step::Renew,
        None | Some("") => return Step::Take,
        Some(_) => {}
    }
    let duration = SignedDuration::from_secs(spec.lease_duration_seconds.unwrap_or(15).into());
    match &spec.renew_time {
        Some(MicroTime(t)) if *t + duration > now => Step::Follow,
        _ => Step::Take,
    }
}

pub struct Elector {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
}

impl Elector {
    pub fn new(
        client: Client,
        namespace: &str,
        name: &str,
        identity: &str,
        duration: Duration,
    ) -> Self {
        Elector {
            api: Api::namespaced(client, namespace),
            name: name.to_owned(),
            identity: identity.to_owned(),
            duration,
        }
    }

    fn spec(&self, now: Timestamp, acquired: Option<MicroTime>, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(self.duration.as_secs().try_into().unwrap_or(i32::MAX)),
            acquire_time: Some(acquired.unwrap_or(MicroTime(now))),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(transitions),
            ..Default::default()
        }
    }

    /// Whether this replica holds the Lease after this call.
    pub async fn try_acquire_or_renew(&self) -> Result<bool, kube::Error> {
        let now = Timestamp::now();
        let current = self.api.get_opt(&self.name).await?;
        let step = decide(current.as_ref(), &self.identity, now);
        let res = match (step, current) {
            (Step::Follow, _) => return Ok(false),
            (Step::Create, _) => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        ..Default::default()
                    },
                    spec: Some(self.spec(now, None, 0)),
                };
                self.api.create(&PostParams::default(), &lease).await
            }
            (step, Some(mut lease)) => {
                let old = lease.spec.take().unwrap_or_default();
                let transitions = old.lease_transitions.unwrap_or(0);
                lease.spec = Some(if step == Step::Renew {
                    self.spec(now, old.acquire_time, transitions)
                } else {
                    self.spec(now, None, transitions + 1)
                });
                // metadata.resourceVersion stays: a concurrent writer wins, we lose.
                self.api
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await
            }
            (_, None) => return Ok(false),
        };
        match res {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.is_conflict() || s.is_already_exists() => Ok(false),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: Option<&str>, renewed: Timestamp, secs: i32) -> Lease {
        Lease {
            metadata: ObjectMeta::default(),
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_owned),
                lease_duration_seconds: Some(secs),
                renew_time: Some(MicroTime(renewed)),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn lease_decisions() {
        let now = Timestamp::now();
        let ago = |s: i64| now - SignedDuration::from_secs(s);
        assert_eq!(decide(None, "a", now), Step::Create);
        assert_eq!(
            decide(Some(&lease(Some("a"), ago(100), 15)), "a", now),
            Step::Renew
        );
        assert_eq!(
            decide(Some(&lease(Some("b"), ago(5), 15)), "a", now),
            Step::Follow
        );
        assert_eq!(
            decide(Some(&lease(Some("b"), ago(16), 15)), "a", now),
            Step::Take
        );
        assert_eq!(decide(Some(&lease(None, ago(1), 15)), "a", now), Step::Take);
        assert_eq!(
            decide(Some(&lease(Some(""), ago(1), 15)), "a", now),
            Step::Take
        );
    }
}
