//! The liveness endpoint (`--liveness-addr`, issue 38): `/healthz` answers
//! 200 while the driver can be reached, whatever its pools do, and 500 once
//! its CSI socket is gone; it recovers by itself when the socket is back.
//! The deadline is 3 s here, so the driver probes itself every second.

use std::fs;
use std::time::{Duration, Instant};

use sanity_tests::*;

const DEADLINE_S: u64 = 3;

/// Waits until `/healthz` answers a status line containing `want` (and a
/// body containing `body`); panics with the last answer and the log after
/// `within`.
async fn wait_healthz(d: &Driver, port: u16, want: &str, body: &str, within: Duration) -> String {
    let start = Instant::now();
    loop {
        let got = http_get(port, "/healthz");
        if let Ok((status, text)) = &got {
            if status.contains(want) && text.contains(body) {
                return text.clone();
            }
        }
        assert!(
            start.elapsed() < within,
            "/healthz should answer {want} ({body:?}) within {within:?}; last: {got:?}\n{}",
            d.log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `/healthz` answers 200 for all of `during`.
async fn stays_alive(d: &Driver, port: u16, during: Duration, what: &str) {
    let start = Instant::now();
    while start.elapsed() < during {
        let (status, text) = http_get(port, "/healthz").expect("GET /healthz");
        assert!(
            status.contains("200"),
            "{what}: /healthz answered {status} {text}\n{}",
            d.log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn liveness_fails_only_when_the_driver_cannot_be_reached() {
    let port = free_port();
    let d = Driver::start(DriverOpts {
        args: vec![
            "--liveness-addr".into(),
            format!("127.0.0.1:{port}"),
            "--liveness-deadline".into(),
            DEADLINE_S.to_string(),
        ],
        ..DriverOpts::default()
    })
    .await;
    let text = wait_healthz(&d, port, "200", "ok", Duration::from_secs(10)).await;
    assert!(text.contains("last Probe answered"), "{text}");
    // Only GET /healthz is served there.
    let (status, _) = http_get(port, "/metrics").unwrap();
    assert!(status.contains("404"), "{status}");

    // An unusable pool is no reason to restart: alive for twice the deadline.
    let vols = d.volumes_dir();
    let aside = vols.with_file_name("volumes.aside");
    fs::rename(&vols, &aside).unwrap();
    stays_alive(
        &d,
        port,
        Duration::from_secs(2 * DEADLINE_S),
        "an unusable pool",
    )
    .await;
    fs::rename(&aside, &vols).unwrap();

    // The socket gone (removed behind the driver's back): nobody can reach
    // the driver, so it is dead; a restart would bind a new socket.
    let sock = d.socket_path();
    let moved = sock.with_file_name("csi.sock.aside");
    fs::rename(&sock, &moved).unwrap();
    let text = wait_healthz(
        &d,
        port,
        "500",
        "the CSI socket cannot be reached",
        Duration::from_secs(2 * DEADLINE_S + 2),
    )
    .await;
    assert!(text.contains("csi.sock"), "{text}");
    // Back: alive again without a restart.
    fs::rename(&moved, &sock).unwrap();
    wait_healthz(
        &d,
        port,
        "200",
        "ok",
        Duration::from_secs(2 * DEADLINE_S + 2),
    )
    .await;
    assert!(d.pid().is_some(), "the driver exited");
}
