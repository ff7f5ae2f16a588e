//! The driver while its pools open. `serve` binds the CSI socket first and
//! opens the pools behind it (minutes on a node whose lvm is slow), so that
//! kubelet and the sidecars find a server that answers from the start:
//!
//! - Identity answers at once; Probe says `ready: false` until the pools are
//!   open, which is what the sidecars' start waits for (their `ProbeForever`
//!   retries "not ready", where a refused connection or an error ends them);
//! - NodeGetInfo answers at once (kubelet's plugin registration needs it);
//! - every other Node call, and the whole Controller service, is UNAVAILABLE
//!   ("opening its pools"), which kubelet and the sidecars retry.
//!
//! [`Opened`] is the handle the Identity and Node services read; [`Gate`]
//! holds back a whole service (the Controller's, whose capabilities depend on
//! the pools) until it is built.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use tonic::body::Body;
use tonic::server::NamedService;
use tonic::Status;
use tower::Service;

use crate::driver::Driver;
use crate::ops::Refusal;

fn opening() -> Status {
    Refusal::Opening.into()
}

/// The driver once its pools are open; until then, UNAVAILABLE.
#[derive(Clone, Default)]
pub struct Opened(Arc<OnceLock<Arc<Driver>>>);

impl Opened {
    /// The pools are open: every later call sees this driver.
    pub fn set(&self, driver: Arc<Driver>) {
        let _ = self.0.set(driver);
    }

    pub fn get(&self) -> Result<&Arc<Driver>, Status> {
        self.0.get().ok_or_else(opening)
    }

    pub fn is_open(&self) -> bool {
        self.0.get().is_some()
    }
}

/// A gRPC service that answers UNAVAILABLE until [`Gate::open`] gives it
/// the real one.
pub struct Gate<S>(Arc<OnceLock<S>>);

impl<S> Clone for Gate<S> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<S> Default for Gate<S> {
    fn default() -> Self {
        Self(Arc::default())
    }
}

impl<S> Gate<S> {
    pub fn open(&self, svc: S) {
        let _ = self.0.set(svc);
    }
}

impl<S: NamedService> NamedService for Gate<S> {
    const NAME: &'static str = S::NAME;
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S> Service<http::Request<Body>> for Gate<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // tonic's generated servers are always ready.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        match self.0.get() {
            Some(svc) => {
                let mut svc = svc.clone();
                Box::pin(async move { svc.call(req).await })
            }
            None => Box::pin(async move { Ok(opening().into_http()) }),
        }
    }
}
