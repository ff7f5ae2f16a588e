//! The driver's `/metrics` endpoint (`--metrics-addr`): a port to serve it on,
//! a plain HTTP GET, and one sample's value.

/// A TCP port on 127.0.0.1 that was free a moment ago (for `--metrics-addr`).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("binding 127.0.0.1:0")
        .port()
}

/// GET `path` from `127.0.0.1:port` (plain HTTP/1.0): the status line and body.
pub fn http_get(port: u16, path: &str) -> std::io::Result<(String, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let status = head.lines().next().unwrap_or_default().to_owned();
    Ok((status, body.to_owned()))
}

/// The value of one sample line (`name{labels} value`) of a /metrics body.
pub fn metric_value(body: &str, name_and_labels: &str) -> Option<f64> {
    body.lines().find_map(|l| {
        l.strip_prefix(name_and_labels)
            .and_then(|rest| rest.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
    })
}
