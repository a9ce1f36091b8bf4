//! The stored first response of an idempotent request, in a compact binary form:
//!
//! ```text
//! "TGR1" | status: u16 | header count: u16 | (name len: u16, name, value len: u32, value)* | body
//! ```
//!
//! All integers are big-endian. Hop-by-hop fields and `Content-Length` are not stored: the
//! replay's length comes from its body. `Set-Cookie` is stored only for a key a user owns: an
//! anonymous key is shared by whoever sends it, and a repeat from another client must not get
//! the first one's session.

use bytes::Bytes;
use http::{HeaderName, HeaderValue, StatusCode, header, response::Parts};

const MAGIC: &[u8; 4] = b"TGR1";

fn is_stored(name: &HeaderName, cookies: bool) -> bool {
    if name == header::SET_COOKIE {
        return cookies;
    }
    !matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "transfer-encoding"
            | "upgrade"
            | "te"
            | "trailer"
            | "content-length"
    )
}

/// Encodes a response for replay, with its `Set-Cookie` fields if `cookies` (the key is a
/// user's own); `None` if a header is too long for the format (it is then not replayable).
pub(crate) fn encode(parts: &Parts, body: &[u8], cookies: bool) -> Option<Vec<u8>> {
    let headers: Vec<_> = parts
        .headers
        .iter()
        .filter(|(n, _)| is_stored(n, cookies))
        .collect();
    let mut out = Vec::with_capacity(8 + body.len() + headers.len() * 32);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&parts.status.as_u16().to_be_bytes());
    out.extend_from_slice(&u16::try_from(headers.len()).ok()?.to_be_bytes());
    for (name, value) in headers {
        out.extend_from_slice(&u16::try_from(name.as_str().len()).ok()?.to_be_bytes());
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(&u32::try_from(value.len()).ok()?.to_be_bytes());
        out.extend_from_slice(value.as_bytes());
    }
    out.extend_from_slice(body);
    Some(out)
}

/// Decodes a stored response; `None` if it is not one (e.g. the empty marker of a response
/// that was too large to keep).
pub(crate) fn decode(stored: Vec<u8>) -> Option<http::Response<Bytes>> {
    let mut r = Reader {
        bytes: Bytes::from(stored),
        at: 0,
    };
    if &r.take(4)?[..] != MAGIC {
        return None;
    }
    let status = StatusCode::from_u16(r.u16()?).ok()?;
    let count = r.u16()?;
    let mut response = http::Response::new(Bytes::new());
    *response.status_mut() = status;
    for _ in 0..count {
        let len = usize::from(r.u16()?);
        let name = HeaderName::from_bytes(&r.take(len)?).ok()?;
        let len = usize::try_from(r.u32()?).ok()?;
        let value = HeaderValue::from_maybe_shared(r.take(len)?).ok()?;
        response.headers_mut().append(name, value);
    }
    *response.body_mut() = r.bytes.slice(r.at..);
    response.headers_mut().remove(header::CONTENT_LENGTH);
    Some(response)
}

struct Reader {
    bytes: Bytes,
    at: usize,
}

impl Reader {
    fn take(&mut self, n: usize) -> Option<Bytes> {
        let end = self.at.checked_add(n)?;
        if end > self.bytes.len() {
            return None;
        }
        let chunk = self.bytes.slice(self.at..end);
        self.at = end;
        Some(chunk)
    }

    fn u16(&mut self) -> Option<u16> {
        let b = self.take(2)?;
        Some(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Option<u32> {
        let b = self.take(4)?;
        Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_status_headers_and_body() {
        let (parts, ()) = http::Response::builder()
            .status(201)
            .header("content-type", "application/json")
            .header("set-cookie", "a=1")
            .header("set-cookie", "b=2")
            .header("transfer-encoding", "chunked")
            .header("content-length", "9")
            .body(())
            .unwrap()
            .into_parts();
        let anonymous = decode(encode(&parts, b"", false).unwrap()).unwrap();
        assert!(
            !anonymous.headers().contains_key("set-cookie"),
            "no one else's session"
        );
        assert_eq!(anonymous.headers()["content-type"], "application/json");
        let stored = encode(&parts, b"{\"id\":7}\xff", true).unwrap();
        let replay = decode(stored).unwrap();
        assert_eq!(replay.status(), 201);
        assert_eq!(replay.headers()["content-type"], "application/json");
        let cookies: Vec<_> = replay.headers().get_all("set-cookie").iter().collect();
        assert_eq!(cookies, ["a=1", "b=2"]);
        assert!(!replay.headers().contains_key("transfer-encoding"));
        assert!(!replay.headers().contains_key("content-length"));
        assert_eq!(&replay.body()[..], b"{\"id\":7}\xff");
    }

    #[test]
    fn junk_is_not_a_response() {
        assert!(decode(Vec::new()).is_none());
        assert!(decode(b"TGR1\x00".to_vec()).is_none());
        assert!(decode(b"TGR1\x00\xc8\x00\x01\x00\x09".to_vec()).is_none());
        assert!(decode(b"XXXX\x00\xc8\x00\x00".to_vec()).is_none());
    }
}
