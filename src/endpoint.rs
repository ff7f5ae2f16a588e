//! CSI endpoints (`unix:///path/csi.sock`, `tcp://127.0.0.1:10000`) and the
//! client side of connecting to one, shared by `localvol client`, `localvol bench`
//! and the conformance suite.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint as TonicEndpoint, Uri};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Unix(PathBuf),
    Tcp(SocketAddr),
}

impl FromStr for Endpoint {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(rest) = s
            .strip_prefix("unix://")
            .or_else(|| s.strip_prefix("unix:"))
        {
            let p = PathBuf::from(rest);
            if !p.is_absolute() {
                return Err(format!(
                    "endpoint {s:?}: the socket path must be absolute (unix:///path/csi.sock)"
                ));
            }
            Ok(Endpoint::Unix(p))
        } else if let Some(rest) = s.strip_prefix("tcp://") {
            rest.parse()
                .map(Endpoint::Tcp)
                .map_err(|e| format!("endpoint {s:?}: {e}"))
        } else if s.starts_with('/') {
            Ok(Endpoint::Unix(PathBuf::from(s)))
        } else {
            Err(format!(
                "endpoint {s:?}: use unix:///path/to/csi.sock or tcp://host:port"
            ))
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Unix(p) => write!(f, "unix://{}", p.display()),
            Endpoint::Tcp(a) => write!(f, "tcp://{a}"),
        }
    }
}

impl Endpoint {
    /// Opens a gRPC channel to the endpoint.
    pub async fn connect(&self) -> Result<Channel, tonic::transport::Error> {
        match self {
            Endpoint::Tcp(addr) => {
                TonicEndpoint::from_shared(format!("http://{addr}"))?
                    .connect()
                    .await
            }
            Endpoint::Unix(path) => {
                let path = path.clone();
                // The URI is required by the API but unused: the connector dials the socket.
                TonicEndpoint::try_from("http://[::1]:50051")?
                    .connect_with_connector(tower::service_fn(move |_: Uri| {
                        let path = path.clone();
                        async move {
                            tokio::net::UnixStream::connect(path)
                                .await
                                .map(TokioIo::new)
                        }
                    }))
                    .await
            }
        }
    }

    /// Connects and sends one CSI Probe: Ok once the driver answered, with
    /// any answer (an error status is the server answering too); Err when
    /// nothing could connect.
    pub async fn probe(&self) -> Result<(), tonic::transport::Error> {
        let channel = self.connect().await?;
        let _ = crate::csi::identity_client::IdentityClient::new(channel)
            .probe(crate::csi::ProbeRequest {})
            .await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_endpoints() {
        assert_eq!(
            "unix:///run/csi.sock".parse::<Endpoint>().unwrap(),
            Endpoint::Unix("/run/csi.sock".into())
        );
        assert_eq!(
            "unix:/run/csi.sock".parse::<Endpoint>().unwrap(),
            Endpoint::Unix("/run/csi.sock".into())
        );
        assert_eq!(
            "tcp://127.0.0.1:9".parse::<Endpoint>().unwrap(),
            Endpoint::Tcp("127.0.0.1:9".parse().unwrap())
        );
        for bad in ["unix://rel.sock", "http://x", "tcp://nohost", ""] {
            assert!(bad.parse::<Endpoint>().is_err(), "{bad}");
        }
    }
}
