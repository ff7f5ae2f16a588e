//! Makes the CSI socket usable by gRPC clients that send the socket's path as
//! the HTTP/2 `:authority`.
//!
//! grpc C-core (Python `grpcio`, Ruby, C++), grpc-java, and `grpcurl` / `csc`
//! with default settings send e.g. `/var/lib/kubelet/plugins/localvol/csi.sock`
//! as `:authority` when they dial a unix socket. h2 (0.4.20, the newest
//! release) parses `:authority` as a URI authority, fails, and resets every
//! such stream with PROTOCOL_ERROR, so all of those clients' RPCs fail.
//!
//! [`AuthorityFix`] wraps each accepted unix-socket connection. It reads the
//! client→server byte stream as HTTP/2 (the 24-byte preface, then frames) and
//! rewrites exactly one thing: an `:authority` that is not a valid URI
//! authority (the same `http::uri::Authority` parse h2 does) becomes
//! `localhost`. The driver never looks at the authority, so nothing it does
//! changes. Server→client bytes, and every frame other than HEADERS and
//! CONTINUATION, pass through byte for byte (DATA is forwarded in place, not
//! buffered).
//!
//! Why this cannot corrupt other streams: header blocks are HPACK-compressed
//! against a dynamic table that the client's encoder and the server's decoder
//! (h2's) keep in step. This module decodes every header block with its own
//! decoder, which mirrors the client's encoder exactly because it sees the same
//! bytes. As long as no block needed a rewrite, blocks are forwarded unchanged,
//! so h2's table is the same as ours. From the first rewritten block on, *every*
//! later header block of the connection is re-encoded from its decoded headers
//! using only literals without indexing: such a block neither reads nor
//! changes h2's dynamic table, so h2's (now stale) table is never consulted
//! again, and each block h2 decodes is exactly the client's header list (with
//! the one authority replaced). Header blocks are reassembled from HEADERS and
//! CONTINUATION frames (padding removed, PRIORITY fields and END_STREAM kept)
//! and re-emitted as one HEADERS frame plus CONTINUATIONs of at most 16384
//! bytes of payload, the SETTINGS_MAX_FRAME_SIZE every HTTP/2 peer accepts.
//! Per-connection memory is bounded: a header block (or its decoded header
//! list) over [`MAX_HEADER_BLOCK`], an HPACK error, or a broken frame sequence
//! ends the connection with an io error; nothing here panics on input.
//! Connections whose first bytes are not the HTTP/2 preface are passed through
//! untouched (h2 rejects them itself).
//!
//! Only the first header block of a connection decides. When its authority
//! is valid (tonic, grpc-go, the CSI sidecars and kubelet all send
//! `localhost`), the rest of the connection passes through untouched, with
//! no HPACK decoding at all: a gRPC client keeps one authority per
//! connection, and the decoding cost every RPC on a connection that a
//! single task serves (it capped a 16-core node's lifecycles/s). A client
//! that switched to an invalid authority later on the same connection would
//! get h2's PROTOCOL_ERROR for those calls, as without the adapter.
//!
//! Only unix sockets get the adapter: over TCP the authority is `host:port`.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use loona_hpack::encoder::encode_integer_into;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER_LEN: usize = 9;
const TYPE_HEADERS: u8 = 0x1;
const TYPE_CONTINUATION: u8 = 0x9;
const FLAG_END_STREAM: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;
/// Payload limit of the frames this module writes: HTTP/2's initial
/// SETTINGS_MAX_FRAME_SIZE, which a peer can only raise (and tonic does not).
const MAX_FRAME_PAYLOAD: usize = 16_384;
/// The largest header block (HEADERS plus CONTINUATION frames, as received)
/// and the largest decoded header list (RFC 7541 sizes: name + value + 32 per
/// field) a connection may send; more ends the connection.
pub const MAX_HEADER_BLOCK: usize = 1 << 20;
/// HPACK's dynamic table limit: h2 (as tonic configures it) never advertises
/// another SETTINGS_HEADER_TABLE_SIZE, so the client may not exceed this.
const HEADER_TABLE_SIZE: usize = 4096;
const AUTHORITY: &[u8] = b":authority";
const REPLACEMENT: &[u8] = b"localhost";

/// A connection whose client→server HTTP/2 stream has invalid `:authority`
/// values replaced by `localhost` (see the module docs).
pub struct AuthorityFix<S> {
    inner: S,
    rx: Rewriter,
}

impl<S> AuthorityFix<S> {
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            rx: Rewriter::new(),
        }
    }
}

impl<S: Connected> Connected for AuthorityFix<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityFix<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.rx.state == State::Failed {
            return Poll::Ready(Err(invalid("connection already failed")));
        }
        loop {
            if this.rx.drain_pending(buf) {
                return Poll::Ready(Ok(()));
            }
            if buf.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            let start = buf.filled().len();
            ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
            let end = buf.filled().len();
            if end == start {
                return Poll::Ready(Ok(())); // end of stream
            }
            let kept = this.rx.feed(&mut buf.filled_mut()[start..end])?;
            buf.set_filled(start + kept);
            if kept > 0 {
                return Poll::Ready(Ok(()));
            }
            // Everything read was held back (a header block still arriving)
            // or queued: drain the queue or read more, never report 0 bytes.
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityFix<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum State {
    /// This many bytes of the preface have been seen.
    Preface(usize),
    /// Collecting a 9-byte frame header.
    FrameHeader,
    /// Forwarding this many more payload bytes unchanged.
    Pass(usize),
    /// Collecting this many more payload bytes of a header block frame.
    Block(usize),
    /// Not HTTP/2: everything passes through.
    Transparent,
    /// An error was returned; every later read returns one too.
    Failed,
}

/// The client→server half: a push parser that rewrites header blocks.
struct Rewriter {
    state: State,
    header: [u8; FRAME_HEADER_LEN],
    header_len: usize,
    /// The frames (headers included) of the header block being collected.
    block: Vec<u8>,
    /// Some(stream id) while a header block awaits CONTINUATION frames.
    continuation_of: Option<u32>,
    decoder: loona_hpack::Decoder<'static>,
    /// Set by the first rewrite: from then on every block is re-encoded.
    reencode: bool,
    /// Output that follows what `feed` left in place.
    pending: Vec<u8>,
    pending_pos: usize,
}

/// Where `feed` puts output: back into the read buffer over consumed bytes
/// (the common case, no copy), or, once that is not possible, into `pending`.
struct Out<'a> {
    buf: &'a mut [u8],
    /// Output bytes at the front of `buf`; always <= the consumed position.
    kept: usize,
    pending: Vec<u8>,
}

impl Out<'_> {
    /// Emits bytes that are not (or no longer) in the buffer.
    fn emit(&mut self, bytes: &[u8], consumed: usize) {
        if self.pending.is_empty() && self.kept + bytes.len() <= consumed {
            self.buf[self.kept..self.kept + bytes.len()].copy_from_slice(bytes);
            self.kept += bytes.len();
        } else {
            self.pending.extend_from_slice(bytes);
        }
    }

    /// Emits `buf[from..to]` unchanged.
    fn pass(&mut self, from: usize, to: usize) {
        if !self.pending.is_empty() {
            self.pending.extend_from_slice(&self.buf[from..to]);
        } else {
            if self.kept != from {
                self.buf.copy_within(from..to, self.kept);
            }
            self.kept += to - from;
        }
    }
}

fn invalid(msg: impl Into<String>) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("HTTP/2 authority rewrite: {}", msg.into()),
    )
}

impl Rewriter {
    fn new() -> Self {
        let mut decoder = loona_hpack::Decoder::new();
        decoder.set_max_allowed_table_size(HEADER_TABLE_SIZE);
        Self {
            state: State::Preface(0),
            header: [0; FRAME_HEADER_LEN],
            header_len: 0,
            block: Vec::new(),
            continuation_of: None,
            decoder,
            reencode: false,
            pending: Vec::new(),
            pending_pos: 0,
        }
    }

    /// Copies queued output into `buf`; true if it copied anything.
    fn drain_pending(&mut self, buf: &mut ReadBuf<'_>) -> bool {
        if self.pending_pos == self.pending.len() || buf.remaining() == 0 {
            return false;
        }
        let n = buf.remaining().min(self.pending.len() - self.pending_pos);
        buf.put_slice(&self.pending[self.pending_pos..self.pending_pos + n]);
        self.pending_pos += n;
        if self.pending_pos == self.pending.len() {
            self.pending.clear();
            self.pending_pos = 0;
            if self.pending.capacity() > 4 * MAX_FRAME_PAYLOAD {
                self.pending = Vec::new();
            }
        }
        true
    }

    /// Processes freshly read bytes in place. Returns how many bytes at the
    /// front of `buf` are output; any further output was queued in `pending`.
    fn feed(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.state == State::Failed {
            return Err(invalid("connection already failed"));
        }
        let res = self.feed_inner(buf);
        if res.is_err() {
            self.state = State::Failed;
            self.block = Vec::new();
        }
        res
    }

    fn feed_inner(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let len = buf.len();
        debug_assert!(
            self.pending.is_empty(),
            "feed runs only once the queue is drained"
        );
        let mut out = Out {
            buf,
            kept: 0,
            pending: std::mem::take(&mut self.pending),
        };
        let mut pos = 0;
        while pos < len {
            let avail = len - pos;
            match self.state {
                State::Transparent => {
                    out.pass(pos, len);
                    pos = len;
                }
                State::Preface(seen) => {
                    let n = avail.min(PREFACE.len() - seen);
                    if out.buf[pos..pos + n] != PREFACE[seen..seen + n] {
                        // Not HTTP/2 with prior knowledge: h2 rejects it; we
                        // stay out of the way.
                        self.state = State::Transparent;
                        continue;
                    }
                    out.pass(pos, pos + n);
                    pos += n;
                    self.state = if seen + n == PREFACE.len() {
                        State::FrameHeader
                    } else {
                        State::Preface(seen + n)
                    };
                }
                State::FrameHeader => {
                    let n = avail.min(FRAME_HEADER_LEN - self.header_len);
                    self.header[self.header_len..self.header_len + n]
                        .copy_from_slice(&out.buf[pos..pos + n]);
                    self.header_len += n;
                    pos += n;
                    if self.header_len == FRAME_HEADER_LEN {
                        self.header_len = 0;
                        self.start_frame(&mut out, pos)?;
                    }
                }
                State::Pass(left) => {
                    let n = avail.min(left);
                    out.pass(pos, pos + n);
                    pos += n;
                    self.state = if n == left {
                        State::FrameHeader
                    } else {
                        State::Pass(left - n)
                    };
                }
                State::Block(left) => {
                    let n = avail.min(left);
                    self.block.extend_from_slice(&out.buf[pos..pos + n]);
                    pos += n;
                    if n == left {
                        self.end_block_frame(&mut out, pos)?;
                    } else {
                        self.state = State::Block(left - n);
                    }
                }
                State::Failed => unreachable!("feed returns before parsing a failed connection"),
            }
        }
        self.pending = out.pending;
        Ok(out.kept)
    }

    /// A complete frame header is in `self.header`.
    fn start_frame(&mut self, out: &mut Out<'_>, pos: usize) -> io::Result<()> {
        let h = self.header;
        let len = u32::from_be_bytes([0, h[0], h[1], h[2]]) as usize;
        let kind = h[3];
        let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
        match (self.continuation_of, kind) {
            (Some(id), TYPE_CONTINUATION) if id == stream => {}
            (Some(id), _) => {
                return Err(invalid(format!(
                    "frame type {kind} on stream {stream} inside the header block of stream {id}"
                )))
            }
            (None, TYPE_HEADERS) => {}
            (None, _) => {
                // Not a header block (a stray CONTINUATION included: h2
                // rejects that itself): forward it unchanged.
                out.emit(&h, pos);
                self.state = if len == 0 {
                    State::FrameHeader
                } else {
                    State::Pass(len)
                };
                return Ok(());
            }
        }
        if self.block.len() + FRAME_HEADER_LEN + len > MAX_HEADER_BLOCK {
            return Err(invalid(format!(
                "header block of stream {stream} exceeds {MAX_HEADER_BLOCK} bytes"
            )));
        }
        self.block.extend_from_slice(&h);
        self.continuation_of = Some(stream);
        self.state = State::Block(len);
        if len == 0 {
            self.end_block_frame(out, pos)?;
        }
        Ok(())
    }

    /// The frame most recently added to `self.block` is complete.
    fn end_block_frame(&mut self, out: &mut Out<'_>, pos: usize) -> io::Result<()> {
        self.state = State::FrameHeader;
        let last_flags = self.header[4];
        if last_flags & FLAG_END_HEADERS == 0 {
            return Ok(()); // CONTINUATION follows
        }
        self.continuation_of = None;
        let block = std::mem::take(&mut self.block);
        let res = self.finish_block(&block);
        match res? {
            None if !self.reencode => {
                // The connection's first request had a valid authority: a
                // client keeps one authority per connection, so nothing of
                // this connection needs the adapter any more.
                out.emit(&block, pos);
                self.state = State::Transparent;
                self.decoder = loona_hpack::Decoder::new();
                self.block = Vec::new();
                return Ok(());
            }
            None => out.emit(&block, pos),
            Some(rewritten) => out.emit(&rewritten, pos),
        }
        self.block = block;
        self.block.clear();
        if self.block.capacity() > 4 * MAX_FRAME_PAYLOAD {
            self.block = Vec::new();
        }
        Ok(())
    }

    /// Decodes a complete header block (its raw frames); returns the frames to
    /// send instead, or None to send it unchanged.
    fn finish_block(&mut self, raw: &[u8]) -> io::Result<Option<Vec<u8>>> {
        let first = parse_block(raw)?;
        let mut fragment = Vec::with_capacity(raw.len());
        for f in &first.fragments {
            fragment.extend_from_slice(&raw[f.0..f.1]);
        }

        let mut headers: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        let mut size = 0usize;
        let mut too_big = false;
        let mut rewrite = false;
        self.decoder
            .decode_with_cb(&fragment, |name, value| {
                size = size.saturating_add(name.len() + value.len() + 32);
                if too_big || size > MAX_HEADER_BLOCK {
                    too_big = true;
                    return;
                }
                if &*name == AUTHORITY && http::uri::Authority::try_from(&*value).is_err() {
                    rewrite = true;
                    headers.push((name.into_owned(), REPLACEMENT.to_vec()));
                } else {
                    headers.push((name.into_owned(), value.into_owned()));
                }
            })
            .map_err(|e| invalid(format!("HPACK decoding failed: {e:?}")))?;
        if too_big {
            return Err(invalid(format!(
                "decoded header list exceeds {MAX_HEADER_BLOCK} bytes"
            )));
        }
        if !rewrite && !self.reencode {
            return Ok(None);
        }
        if rewrite && !self.reencode {
            tracing::debug!("replacing an invalid :authority with localhost on this connection");
        }
        self.reencode = true;

        let mut encoded = Vec::with_capacity(fragment.len() + 64);
        for (name, value) in &headers {
            encode_literal_without_indexing(name, value, &mut encoded);
        }
        Ok(Some(frame_block(&first, &encoded)))
    }
}

/// The parts of a received header block that re-framing needs.
struct ParsedBlock {
    /// HEADERS flags of the first frame.
    flags: u8,
    /// The stream identifier bytes as received.
    stream: [u8; 4],
    /// The 5 bytes of priority fields, when FLAG_PRIORITY is set.
    priority: Option<[u8; 5]>,
    /// Ranges of `raw` holding the header block fragments, in order.
    fragments: Vec<(usize, usize)>,
}

/// Splits a header block's raw frames (one HEADERS, then CONTINUATIONs; the
/// framing was checked while collecting them) into fragments.
fn parse_block(raw: &[u8]) -> io::Result<ParsedBlock> {
    let mut parsed = ParsedBlock {
        flags: raw[4],
        stream: [raw[5], raw[6], raw[7], raw[8]],
        priority: None,
        fragments: Vec::new(),
    };
    let mut at = 0;
    while at < raw.len() {
        let len = u32::from_be_bytes([0, raw[at], raw[at + 1], raw[at + 2]]) as usize;
        let mut from = at + FRAME_HEADER_LEN;
        let mut to = from + len;
        if at == 0 {
            let flags = raw[4];
            let mut pad = 0;
            if flags & FLAG_PADDED != 0 {
                if from >= to {
                    return Err(invalid("PADDED HEADERS frame without a pad length"));
                }
                pad = raw[from] as usize;
                from += 1;
            }
            if flags & FLAG_PRIORITY != 0 {
                if to - from < 5 {
                    return Err(invalid("HEADERS frame too short for its priority fields"));
                }
                let mut p = [0; 5];
                p.copy_from_slice(&raw[from..from + 5]);
                parsed.priority = Some(p);
                from += 5;
            }
            if pad > to - from {
                return Err(invalid("HEADERS padding longer than the frame"));
            }
            to -= pad;
        }
        parsed.fragments.push((from, to));
        at += FRAME_HEADER_LEN + len;
    }
    Ok(parsed)
}

/// HPACK "literal header field without indexing — new name" (RFC 7541
/// 6.2.2): references no table entry and adds none.
fn encode_literal_without_indexing(name: &[u8], value: &[u8], out: &mut Vec<u8>) {
    out.push(0x00);
    for s in [name, value] {
        // Writing to a Vec cannot fail.
        let _ = encode_integer_into(s.len(), 7, 0, out);
        out.extend_from_slice(s);
    }
}

/// Frames a re-encoded header block: one HEADERS (END_STREAM and PRIORITY as
/// received) and as many CONTINUATIONs as needed, END_HEADERS on the last.
fn frame_block(first: &ParsedBlock, encoded: &[u8]) -> Vec<u8> {
    let prio_len = if first.priority.is_some() { 5 } else { 0 };
    let mut out = Vec::with_capacity(encoded.len() + prio_len + 2 * FRAME_HEADER_LEN);
    let mut rest = encoded;
    let mut is_first = true;
    loop {
        let room = MAX_FRAME_PAYLOAD - if is_first { prio_len } else { 0 };
        let n = rest.len().min(room);
        let last = n == rest.len();
        let (kind, mut flags) = if is_first {
            (
                TYPE_HEADERS,
                first.flags & (FLAG_END_STREAM | FLAG_PRIORITY),
            )
        } else {
            (TYPE_CONTINUATION, 0)
        };
        if last {
            flags |= FLAG_END_HEADERS;
        }
        let payload_len = n + if is_first { prio_len } else { 0 };
        out.extend_from_slice(&(payload_len as u32).to_be_bytes()[1..]);
        out.push(kind);
        out.push(flags);
        out.extend_from_slice(&first.stream);
        if is_first {
            if let Some(p) = first.priority {
                out.extend_from_slice(&p);
            }
        }
        out.extend_from_slice(&rest[..n]);
        rest = &rest[n..];
        is_first = false;
        if last {
            return out;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    type Headers = Vec<(Vec<u8>, Vec<u8>)>;

    const SOCKET: &str = "/var/lib/kubelet/plugins/localvol/csi.sock";

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        f.push(kind);
        f.push(flags);
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    fn settings() -> Vec<u8> {
        frame(0x4, 0, 0, &[0, 0x3, 0, 0, 0, 100]) // MAX_CONCURRENT_STREAMS 100
    }

    fn data(stream: u32, payload: &[u8]) -> Vec<u8> {
        frame(0x0, 0, stream, payload)
    }

    fn request(authority: &str, path: &str) -> Headers {
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", authority),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            ("user-agent", "grpc-python/1.0 grpc-c/45.0 (linux; chttp2)"),
        ]
        .iter()
        .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect()
    }

    fn with_authority(h: &Headers, authority: &str) -> Headers {
        h.iter()
            .map(|(n, v)| {
                if n == AUTHORITY {
                    (n.clone(), authority.as_bytes().to_vec())
                } else {
                    (n.clone(), v.clone())
                }
            })
            .collect()
    }

    /// Encodes with the dynamic table (as grpc C-core does): repeated headers
    /// become references to entries earlier blocks inserted.
    fn encode(enc: &mut loona_hpack::Encoder<'static>, h: &Headers) -> Vec<u8> {
        enc.encode(h.iter().map(|(n, v)| (&n[..], &v[..])))
    }

    /// Encodes like grpc C-core does: a field already in the dynamic table is
    /// sent as its index; any other is sent as a literal and inserted.
    /// `table` mirrors the client's dynamic table (newest first).
    fn encode_caching(table: &mut Vec<(Vec<u8>, Vec<u8>)>, h: &Headers) -> Vec<u8> {
        let mut out = Vec::new();
        for (n, v) in h {
            if let Some(i) = table.iter().position(|(tn, tv)| tn == n && tv == v) {
                encode_integer_into(62 + i, 7, 0x80, &mut out).unwrap();
            } else {
                out.push(0x40);
                for s in [n, v] {
                    encode_integer_into(s.len(), 7, 0, &mut out).unwrap();
                    out.extend_from_slice(s);
                }
                table.insert(0, (n.clone(), v.clone()));
            }
        }
        let size: usize = table.iter().map(|(n, v)| n.len() + v.len() + 32).sum();
        assert!(size <= HEADER_TABLE_SIZE, "the test model does not evict");
        out
    }

    fn headers_frame(stream: u32, block: &[u8]) -> Vec<u8> {
        frame(TYPE_HEADERS, FLAG_END_HEADERS, stream, block)
    }

    /// Reads from a slice in chunks of the given sizes (cycled).
    struct Chunked {
        data: Vec<u8>,
        pos: usize,
        sizes: Vec<usize>,
        next: usize,
    }

    impl AsyncRead for Chunked {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            let size = self.sizes[self.next % self.sizes.len()];
            self.next += 1;
            let n = size.min(buf.remaining()).min(self.data.len() - self.pos);
            let pos = self.pos;
            buf.put_slice(&self.data[pos..pos + n]);
            self.pos += n;
            Poll::Ready(Ok(()))
        }
    }

    /// Sends `input` through the adapter, read in `chunks` into a caller
    /// buffer of `read_size` bytes.
    fn run_with(input: &[u8], chunks: &[usize], read_size: usize) -> io::Result<Vec<u8>> {
        let mut fix = AuthorityFix::new(Chunked {
            data: input.to_vec(),
            pos: 0,
            sizes: chunks.to_vec(),
            next: 0,
        });
        futures::executor::block_on(async {
            let mut out = Vec::new();
            let mut buf = vec![0; read_size];
            loop {
                let n = fix.read(&mut buf).await?;
                if n == 0 {
                    return Ok(out);
                }
                out.extend_from_slice(&buf[..n]);
            }
        })
    }

    /// Runs `input` through every chunking (one byte at a time, frame
    /// headers split, odd sizes, all at once) and checks they agree.
    fn run(input: &[u8]) -> io::Result<Vec<u8>> {
        let whole = run_with(input, &[usize::MAX], 1 << 20)?;
        let chunkings: &[(&[usize], usize)] = &[
            (&[1], 64 * 1024),
            (&[2], 64 * 1024),
            (&[3, 7], 64 * 1024),
            (&[5, 4, 13], 64 * 1024),
            (&[9], 64 * 1024),
            (&[24, 4, 5, 100], 64 * 1024),
            (&[4096], 64 * 1024),
            (&[usize::MAX], 1),
            (&[usize::MAX], 7),
            (&[17], 10),
        ];
        for (chunks, read_size) in chunkings {
            let out = run_with(input, chunks, *read_size)?;
            assert!(
                out == whole,
                "chunks {chunks:?} / reads of {read_size} give other bytes than one read"
            );
        }
        Ok(whole)
    }

    #[derive(Debug)]
    struct Frame {
        kind: u8,
        flags: u8,
        stream: u32,
        payload: Vec<u8>,
    }

    fn frames(bytes: &[u8]) -> Vec<Frame> {
        assert_eq!(&bytes[..24], PREFACE, "output starts with the preface");
        let mut at = 24;
        let mut out = Vec::new();
        while at < bytes.len() {
            let len = u32::from_be_bytes([0, bytes[at], bytes[at + 1], bytes[at + 2]]) as usize;
            out.push(Frame {
                kind: bytes[at + 3],
                flags: bytes[at + 4],
                stream: u32::from_be_bytes(bytes[at + 5..at + 9].try_into().unwrap()),
                payload: bytes[at + 9..at + 9 + len].to_vec(),
            });
            at += 9 + len;
        }
        assert_eq!(at, bytes.len(), "output ends on a frame boundary");
        out
    }

    /// Header block fragments of the output, one per block, as h2 would
    /// assemble them; checks frame sizes and flags on the way.
    fn blocks(bytes: &[u8]) -> Vec<(u32, u8, Vec<u8>)> {
        let mut out = Vec::new();
        let mut open: Option<(u32, u8, Vec<u8>)> = None;
        for f in frames(bytes) {
            assert!(f.payload.len() <= MAX_FRAME_PAYLOAD, "frame over 16384");
            match f.kind {
                TYPE_HEADERS => {
                    assert!(open.is_none(), "HEADERS inside a header block");
                    let mut p = &f.payload[..];
                    let mut pad = 0;
                    if f.flags & FLAG_PADDED != 0 {
                        pad = p[0] as usize;
                        p = &p[1..];
                    }
                    if f.flags & FLAG_PRIORITY != 0 {
                        p = &p[5..];
                    }
                    open = Some((f.stream, f.flags, p[..p.len() - pad].to_vec()));
                }
                TYPE_CONTINUATION => {
                    let o = open.as_mut().expect("CONTINUATION after HEADERS");
                    assert_eq!(o.0, f.stream);
                    o.2.extend_from_slice(&f.payload);
                }
                _ => {
                    assert!(open.is_none(), "frame inside a header block");
                    continue;
                }
            }
            if f.flags & FLAG_END_HEADERS != 0 {
                out.push(open.take().unwrap());
            }
        }
        assert!(open.is_none(), "unterminated header block");
        out
    }

    /// Decodes the output's header blocks with one fresh decoder, as h2 does.
    fn decode_all(bytes: &[u8]) -> Vec<Headers> {
        let mut dec = loona_hpack::Decoder::new();
        blocks(bytes)
            .iter()
            .map(|(_, _, b)| dec.decode(b).expect("output decodes"))
            .collect()
    }

    /// A block that references no table entry and inserts none decodes the
    /// same with any decoder, and leaves an empty table empty.
    fn assert_table_neutral(block: &[u8], expect: &Headers) {
        let mut dec = loona_hpack::Decoder::new();
        assert_eq!(&dec.decode(block).expect("decodes on its own"), expect);
        assert!(
            dec.decode(&[0x80 | 62]).is_err(),
            "a rewritten block inserted into the dynamic table"
        );
    }

    fn is_invalid_data(r: io::Result<Vec<u8>>) -> bool {
        matches!(r, Err(e) if e.kind() == io::ErrorKind::InvalidData)
    }

    #[test]
    fn valid_authorities_pass_through_byte_for_byte() {
        let mut enc = loona_hpack::Encoder::new();
        let mut input = PREFACE.to_vec();
        input.extend(settings());
        let first = request("localhost:50051", "/csi.v1.Identity/Probe");
        input.extend(headers_frame(1, &encode(&mut enc, &first)));
        input.extend(data(1, &[0, 0, 0, 0, 0]));
        // The second block is mostly references to the first one's entries.
        let second = request("localhost:50051", "/csi.v1.Identity/GetPluginInfo");
        input.extend(headers_frame(3, &encode(&mut enc, &second)));
        input.extend(frame(0x8, 0, 0, &[0, 0, 0x10, 0])); // WINDOW_UPDATE
        input.extend(data(3, &vec![7; 40_000][..16_384]));
        assert_eq!(run(&input).unwrap(), input);
    }

    #[test]
    fn after_a_valid_first_request_the_connection_passes_through() {
        let mut enc = Vec::new();
        let mut input = PREFACE.to_vec();
        input.extend(settings());
        let r1 = request("localhost", "/csi.v1.Identity/Probe");
        input.extend(headers_frame(1, &encode_caching(&mut enc, &r1)));
        input.extend(data(1, &[0, 0, 0, 0, 0]));
        // Not decoded any more: a later invalid authority reaches h2 as
        // sent (which resets that stream, as without the adapter).
        let r2 = request(SOCKET, "/csi.v1.Identity/GetPluginInfo");
        input.extend(headers_frame(3, &encode_caching(&mut enc, &r2)));
        input.extend(headers_frame(5, &[0x80 | 100])); // not even valid HPACK
        assert_eq!(run(&input).unwrap(), input);
    }

    #[test]
    fn path_authority_becomes_localhost_and_later_blocks_stay_decodable() {
        let mut enc = Vec::new();
        let mut input = PREFACE.to_vec();
        input.extend(settings());
        // 1: the socket path; its entries land in our table only (the
        // rewritten block is table-neutral for h2).
        let r1 = request(SOCKET, "/csi.v1.Identity/Probe");
        input.extend(headers_frame(1, &encode_caching(&mut enc, &r1)));
        input.extend(data(1, &[0, 0, 0, 0, 0]));
        // 2: the socket path again, another method; C-core inserts the path.
        let r2 = request(SOCKET, "/csi.v1.Identity/GetPluginInfo");
        let block2 = encode_caching(&mut enc, &r2);
        assert_eq!(
            block2.iter().filter(|b| **b == 0x40).count(),
            1,
            "path (the authority is a reference to block 1's)"
        );
        input.extend(headers_frame(3, &block2));
        input.extend(data(3, &[0, 0, 0, 0, 0]));
        // 3: the same headers again: nothing but dynamic-table references.
        let block3 = encode_caching(&mut enc, &r2);
        assert!(
            block3.iter().all(|b| b & 0x80 != 0),
            "block 3 is all indexed"
        );
        input.extend(headers_frame(5, &block3));
        // 4: a valid authority, a new header, and references to 1 and 2.
        let mut r4 = request("localhost", "/csi.v1.Controller/ListVolumes");
        r4.push((b"x-trace".to_vec(), b"abc".to_vec()));
        input.extend(headers_frame(7, &encode_caching(&mut enc, &r4)));
        input.extend(data(7, &[0, 0, 0, 0, 0]));

        let out = run(&input).unwrap();
        let got = decode_all(&out);
        let fixed1 = with_authority(&r1, "localhost");
        let fixed = with_authority(&r2, "localhost");
        assert_eq!(
            got,
            vec![fixed1.clone(), fixed.clone(), fixed.clone(), r4.clone()]
        );
        // Every block from the first rewrite on is table-neutral.
        let b = blocks(&out);
        assert_table_neutral(&b[0].2, &fixed1);
        assert_table_neutral(&b[1].2, &fixed);
        assert_table_neutral(&b[2].2, &fixed);
        assert_table_neutral(&b[3].2, &r4);
        // DATA frames are untouched.
        let datas: Vec<_> = frames(&out).into_iter().filter(|f| f.kind == 0).collect();
        assert_eq!(datas.len(), 3);
        assert!(datas.iter().all(|f| f.payload == [0, 0, 0, 0, 0]));
    }

    #[test]
    fn invalid_authorities_are_judged_like_h2_does() {
        for (authority, rewritten) in [
            (SOCKET, true),
            ("", true),
            ("csi.sock", false),
            ("unix:/tmp/csi.sock", true),
            ("localhost:10000", false),
            ("[::1]:80", false),
            ("a b", true),
        ] {
            let mut enc = loona_hpack::Encoder::new();
            let mut input = PREFACE.to_vec();
            input.extend(headers_frame(
                1,
                &encode(&mut enc, &request(authority, "/x")),
            ));
            let out = run(&input).unwrap();
            assert_eq!(out != input, rewritten, "{authority:?}");
            let want = if rewritten { "localhost" } else { authority };
            assert_eq!(decode_all(&out), vec![request(want, "/x")], "{authority:?}");
        }
    }

    #[test]
    fn continuation_padding_and_priority_are_reassembled() {
        for authority in [SOCKET, "localhost"] {
            let mut enc = loona_hpack::Encoder::new();
            let headers = request(authority, "/csi.v1.Node/NodeGetInfo");
            let block = encode(&mut enc, &headers);
            let (a, rest) = block.split_at(10);
            let (b, c) = rest.split_at(rest.len() / 2);
            let mut first = vec![3]; // pad length
            first.extend_from_slice(&[0x80, 0, 0, 1, 15]); // exclusive dep on 1, weight 15
            first.extend_from_slice(a);
            first.extend_from_slice(&[0, 0, 0]);
            let mut input = PREFACE.to_vec();
            input.extend(frame(
                TYPE_HEADERS,
                FLAG_PADDED | FLAG_PRIORITY | FLAG_END_STREAM,
                3,
                &first,
            ));
            input.extend(frame(TYPE_CONTINUATION, 0, 3, b));
            input.extend(frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 3, c));
            input.extend(settings());

            let out = run(&input).unwrap();
            let fs = frames(&out);
            if authority == SOCKET {
                assert_eq!(fs.len(), 2, "one HEADERS frame, then SETTINGS: {fs:?}");
                let h = &fs[0];
                assert_eq!(h.kind, TYPE_HEADERS);
                assert_eq!(h.stream, 3);
                assert_eq!(
                    h.flags,
                    FLAG_PRIORITY | FLAG_END_STREAM | FLAG_END_HEADERS,
                    "padding dropped, END_STREAM and PRIORITY kept"
                );
                assert_eq!(h.payload[..5], [0x80, 0, 0, 1, 15]);
                assert_eq!(
                    decode_all(&out),
                    vec![request("localhost", "/csi.v1.Node/NodeGetInfo")]
                );
            } else {
                assert_eq!(out, input, "a valid block passes through as received");
            }
        }
    }

    #[test]
    fn big_rewritten_block_is_split_into_continuations() {
        let mut enc = loona_hpack::Encoder::new();
        let mut headers = request(SOCKET, "/csi.v1.Controller/CreateVolume");
        headers.push((b"x-big".to_vec(), vec![b'v'; 40_000]));
        let block = encode(&mut enc, &headers);
        let mut input = PREFACE.to_vec();
        let parts: Vec<_> = block.chunks(MAX_FRAME_PAYLOAD).collect();
        for (i, p) in parts.iter().enumerate() {
            let kind = if i == 0 {
                TYPE_HEADERS
            } else {
                TYPE_CONTINUATION
            };
            let mut flags = if i == 0 { FLAG_END_STREAM } else { 0 };
            if i + 1 == parts.len() {
                flags |= FLAG_END_HEADERS;
            }
            input.extend(frame(kind, flags, 1, p));
        }
        let out = run(&input).unwrap();
        let fs = frames(&out);
        assert_eq!(fs.len(), 3);
        assert_eq!(fs[0].kind, TYPE_HEADERS);
        assert_eq!(fs[0].flags, FLAG_END_STREAM);
        assert_eq!((fs[1].kind, fs[1].flags), (TYPE_CONTINUATION, 0));
        assert_eq!(
            (fs[2].kind, fs[2].flags),
            (TYPE_CONTINUATION, FLAG_END_HEADERS)
        );
        assert!(fs
            .iter()
            .all(|f| f.stream == 1 && f.payload.len() <= MAX_FRAME_PAYLOAD));
        assert_eq!(
            decode_all(&out),
            vec![with_authority(&headers, "localhost")]
        );
    }

    #[test]
    fn oversized_header_block_is_an_error() {
        // CONTINUATIONs that never end.
        let mut input = PREFACE.to_vec();
        input.extend(frame(TYPE_HEADERS, 0, 1, &[0x82]));
        for _ in 0..(MAX_HEADER_BLOCK / MAX_FRAME_PAYLOAD + 1) {
            input.extend(frame(TYPE_CONTINUATION, 0, 1, &[0; MAX_FRAME_PAYLOAD]));
        }
        assert!(is_invalid_data(run_with(&input, &[4096], 8192)));
        // One frame whose length field alone is over the limit.
        let mut input = PREFACE.to_vec();
        input.extend_from_slice(&[0xff, 0xff, 0xff, TYPE_HEADERS, 0, 0, 0, 0, 1]);
        assert!(is_invalid_data(run_with(&input, &[1], 100)));
        // A small block that decodes to a huge list: one 4000-byte entry
        // referenced 300 times.
        let mut input = PREFACE.to_vec();
        let mut b1 = vec![0x40, 5];
        b1.extend_from_slice(b"x-big");
        encode_integer_into(4000, 7, 0, &mut b1).unwrap();
        b1.extend(vec![b'v'; 4000]);
        b1.extend([0x80 | 62; 300]);
        input.extend(headers_frame(1, &b1));
        assert!(is_invalid_data(run_with(&input, &[usize::MAX], 1 << 16)));
    }

    #[test]
    fn broken_input_is_an_error_not_a_panic() {
        let cases: Vec<Vec<u8>> = vec![
            // HPACK: an index past both tables.
            headers_frame(1, &[0x80 | 100]),
            // HPACK: a literal whose length runs past the block.
            headers_frame(1, &[0x00, 0x7f, 0x80]),
            // A table size update over what h2 allows.
            headers_frame(1, &[0x3f, 0xe1, 0x7f, 0x82]),
            // PADDED without a pad length; padding longer than the frame.
            frame(TYPE_HEADERS, FLAG_PADDED | FLAG_END_HEADERS, 1, &[]),
            frame(TYPE_HEADERS, FLAG_PADDED | FLAG_END_HEADERS, 1, &[9, 0x82]),
            // PRIORITY fields cut short.
            frame(TYPE_HEADERS, FLAG_PRIORITY | FLAG_END_HEADERS, 1, &[0, 0]),
            // A DATA frame inside a header block.
            [frame(TYPE_HEADERS, 0, 1, &[0x82]), data(1, b"x")].concat(),
            // CONTINUATION of another stream.
            [
                frame(TYPE_HEADERS, 0, 1, &[0x82]),
                frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 3, &[0x84]),
            ]
            .concat(),
        ];
        for case in cases {
            let input = [PREFACE.to_vec(), case.clone()].concat();
            for chunks in [&[1usize][..], &[usize::MAX]] {
                let r = run_with(&input, chunks, 64);
                assert!(is_invalid_data(r), "{case:?} must fail");
            }
        }
    }

    #[test]
    fn after_an_error_reads_keep_failing() {
        let mut input = PREFACE.to_vec();
        input.extend(headers_frame(1, &[0x80 | 100]));
        input.extend(settings());
        let mut fix = AuthorityFix::new(Chunked {
            data: input,
            pos: 0,
            sizes: vec![30],
            next: 0,
        });
        futures::executor::block_on(async {
            let mut buf = [0; 64];
            let mut errors = 0;
            for _ in 0..10 {
                if fix.read(&mut buf).await.is_err() {
                    errors += 1;
                }
            }
            assert!(errors >= 9, "{errors} errors");
        });
    }

    #[test]
    fn non_http2_bytes_pass_through() {
        let input = b"GET / HTTP/1.1\r\nHost: /var/run/csi.sock\r\n\r\n".to_vec();
        assert_eq!(run(&input).unwrap(), input);
        let mut input = PREFACE[..10].to_vec();
        input.extend_from_slice(b"garbage that is not HTTP/2 at all");
        assert_eq!(run(&input).unwrap(), input);
    }

    /// What C-core sends for a unary call on a unix socket: preface,
    /// SETTINGS, HEADERS with the socket path as authority, empty message.
    fn grpc_core_request() -> Vec<u8> {
        let mut enc = loona_hpack::Encoder::new();
        let mut input = PREFACE.to_vec();
        input.extend(frame(0x4, 0, 0, &[]));
        input.extend(headers_frame(
            1,
            &encode(&mut enc, &request(SOCKET, "/csi.v1.Identity/GetPluginInfo")),
        ));
        input.extend(frame(0x0, FLAG_END_STREAM, 1, &[0, 0, 0, 0, 0]));
        input
    }

    /// Serves one connection with h2 (the server tonic uses); answers each
    /// request with 200 and the authority h2 parsed in a header.
    async fn h2_server<S>(io: S)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let Ok(mut conn) = h2::server::handshake(io).await else {
            return;
        };
        while let Some(Ok((req, mut respond))) = conn.accept().await {
            let authority = req.uri().authority().map(|a| a.to_string());
            let resp = http::Response::builder()
                .status(200)
                .header("x-authority", authority.unwrap_or_default())
                .body(())
                .unwrap();
            let _ = respond.send_response(resp, true);
        }
    }

    /// Sends `request` to `server`, returns the frames h2 answered with until
    /// it answered stream 1 (HEADERS or RST_STREAM).
    async fn exchange(mut client: tokio::io::DuplexStream) -> Vec<Frame> {
        client.write_all(&grpc_core_request()).await.unwrap();
        let mut got = PREFACE.to_vec();
        let mut buf = [0; 4096];
        let deadline = std::time::Duration::from_secs(10);
        loop {
            let n = tokio::time::timeout(deadline, client.read(&mut buf))
                .await
                .expect("h2 answers")
                .unwrap();
            assert!(n > 0, "h2 closed the connection");
            got.extend_from_slice(&buf[..n]);
            if let Some(fs) = complete_frames(&got) {
                if fs
                    .iter()
                    .any(|f| f.stream == 1 && (f.kind == 0x1 || f.kind == 0x3))
                {
                    return fs;
                }
            }
        }
    }

    fn complete_frames(bytes: &[u8]) -> Option<Vec<Frame>> {
        let mut at = 24;
        while at + 9 <= bytes.len() {
            at += 9 + (u32::from_be_bytes([0, bytes[at], bytes[at + 1], bytes[at + 2]]) as usize);
        }
        (at == bytes.len()).then(|| frames(bytes))
    }

    #[tokio::test]
    async fn h2_resets_a_path_authority_without_the_adapter() {
        let (client, server) = tokio::io::duplex(1 << 16);
        tokio::spawn(h2_server(server));
        let fs = exchange(client).await;
        let rst = fs
            .iter()
            .find(|f| f.stream == 1 && f.kind == 0x3)
            .expect("h2 resets the stream");
        assert_eq!(rst.payload, 1u32.to_be_bytes(), "PROTOCOL_ERROR");
    }

    #[tokio::test]
    async fn h2_accepts_a_path_authority_through_the_adapter() {
        let (client, server) = tokio::io::duplex(1 << 16);
        tokio::spawn(h2_server(AuthorityFix::new(server)));
        let fs = exchange(client).await;
        assert!(!fs.iter().any(|f| f.kind == 0x3), "no RST_STREAM: {fs:?}");
        let resp = fs.iter().find(|f| f.stream == 1 && f.kind == 0x1).unwrap();
        let headers = loona_hpack::Decoder::new().decode(&resp.payload).unwrap();
        assert!(headers.contains(&(b":status".to_vec(), b"200".to_vec())));
        assert!(headers.contains(&(b"x-authority".to_vec(), b"localhost".to_vec())));
    }
}
