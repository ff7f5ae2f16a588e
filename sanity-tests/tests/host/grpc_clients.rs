//! Clients that send the unix socket's path as the HTTP/2 `:authority` (grpc
//! C-core, grpc-java, grpcurl and csc by default): h2 alone resets their
//! streams with PROTOCOL_ERROR; the driver's adapter (src/authority.rs)
//! rewrites the authority so they work.

use std::process::Command;

use sanity_tests::*;

/// A real C-core client: Python grpcio, driven by `clients/grpcio_probe.py`.
/// Under `CI=true` a missing python3 or grpcio fails the test (.ci/run
/// installs grpcio); elsewhere it prints one SKIPPED line and returns.
#[tokio::test]
async fn python_grpcio_client_over_unix_socket() {
    let has_grpcio = Command::new("python3")
        .args(["-c", "import grpc"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !has_grpcio {
        let ci = std::env::var("CI").is_ok_and(|v| v == "true");
        assert!(
            !ci,
            "python3 with grpcio is required under CI=true: python3 -m pip install grpcio"
        );
        // Straight to stderr: libtest captures eprintln! of passing tests.
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: python grpcio not installed (pip install grpcio)"
        );
        return;
    }

    let d = Driver::start_default().await;
    let probe = workspace_dir().join("sanity-tests/clients/grpcio_probe.py");
    let socket = d.socket_path();
    let out = tokio::task::spawn_blocking(move || {
        Command::new("python3")
            .arg(&probe)
            .arg(&socket)
            .output()
            .expect("running python3")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "grpcio probe failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}\ndriver log:\n{}",
        out.status,
        d.log_tail(30)
    );

    let reply = |method: &str| -> Vec<u8> {
        let line = stdout
            .lines()
            .find_map(|l| l.strip_prefix(method)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no reply to {method} in:\n{stdout}"));
        (0..line.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&line[i..i + 2], 16).expect("hex"))
            .collect()
    };
    let info = reply("/csi.v1.Identity/GetPluginInfo");
    assert!(
        contains(&info, b"localvol.csi.dev"),
        "GetPluginInfo reply lacks the driver name: {info:?}"
    );
    // ControllerGetCapabilities: a non-empty list of capabilities (field 1).
    let caps = reply("/csi.v1.Controller/ControllerGetCapabilities");
    assert!(
        caps.first() == Some(&0x0a),
        "ControllerGetCapabilities reply has no capabilities: {caps:?}"
    );
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Raw HTTP/2 over the driver's socket with the socket path as `:authority`,
/// exactly as grpc C-core sends it. Without the adapter, h2 answers the
/// HEADERS with RST_STREAM(PROTOCOL_ERROR) and no response: the unit test
/// `authority::tests::h2_resets_a_path_authority_without_the_adapter` shows
/// that against h2 itself, and this test would fail at the RST_STREAM check.
#[tokio::test]
async fn raw_http2_with_socket_path_authority() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let d = Driver::start_default().await;
    let socket = d.socket_path();
    let mut conn = tokio::net::UnixStream::connect(&socket)
        .await
        .expect("connecting to the driver socket");

    let mut enc = loona_hpack::Encoder::new();
    let authority = socket.to_str().unwrap();
    let request: Vec<(&[u8], &[u8])> = vec![
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", b"/csi.v1.Identity/GetPluginInfo"),
        (b":authority", authority.as_bytes()),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
    ];
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(frame(SETTINGS, 0, 0, &[]));
    out.extend(frame(HEADERS, END_HEADERS, 1, &enc.encode(request)));
    // An empty GetPluginInfoRequest: uncompressed, zero length.
    out.extend(frame(DATA, END_STREAM, 1, &[0, 0, 0, 0, 0]));
    conn.write_all(&out).await.unwrap();

    let mut dec = loona_hpack::Decoder::new();
    let mut header_blocks = Vec::new();
    let mut body = Vec::new();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let mut head = [0u8; 9];
        tokio::time::timeout_at(deadline, conn.read_exact(&mut head))
            .await
            .expect("the driver answers within 10s")
            .unwrap_or_else(|e| panic!("connection closed ({e}); log:\n{}", d.log_tail(20)));
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let (kind, flags) = (head[3], head[4]);
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        let mut payload = vec![0; len];
        conn.read_exact(&mut payload).await.unwrap();
        match kind {
            SETTINGS if flags & ACK == 0 => {
                conn.write_all(&frame(SETTINGS, ACK, 0, &[])).await.unwrap()
            }
            RST_STREAM => panic!(
                "the driver reset stream {stream} with error code {:?} \
                 (1 = PROTOCOL_ERROR: the :authority was not rewritten)",
                payload
            ),
            GOAWAY => panic!("the driver sent GOAWAY: {payload:?}"),
            HEADERS if stream == 1 => {
                assert!(flags & END_HEADERS != 0, "response headers in one frame");
                let headers = dec.decode(&payload).expect("HPACK from the driver");
                header_blocks.push(headers);
                if flags & END_STREAM != 0 {
                    break;
                }
            }
            DATA if stream == 1 => body.extend_from_slice(&payload),
            _ => {}
        }
    }

    let field = |block: &Vec<(Vec<u8>, Vec<u8>)>, name: &[u8]| {
        block
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    };
    assert_eq!(header_blocks.len(), 2, "response headers and trailers");
    assert_eq!(field(&header_blocks[0], b":status").as_deref(), Some("200"));
    let trailers = &header_blocks[1];
    assert_eq!(
        field(trailers, b"grpc-status").as_deref(),
        Some("0"),
        "trailers: {trailers:?}"
    );
    assert!(body.len() > 5, "a gRPC message in the body");
    assert!(
        contains(&body, b"localvol.csi.dev"),
        "GetPluginInfo body lacks the driver name: {body:?}"
    );
}

const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const GOAWAY: u8 = 0x7;
const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    f.extend_from_slice(&[kind, flags]);
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}
