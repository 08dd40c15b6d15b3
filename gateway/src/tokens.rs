//! Signed tokens of the waiting room: HMAC-SHA256 over a small binary payload, verified in
//! constant time (`hmac`'s `verify_slice`).
//!
//! Text form: `base64url(payload) "." base64url(tag)`, no padding. Payload:
//! `[version u8 = 1][kind u8][expires_at_ms u64][number u64][at_ms u64][epoch u64]
//! [event len u16][event][user len u16][user]`, integers big-endian. For a queue token `number`
//! is the fan's join sequence, `at_ms` when they joined and `epoch` the waiting room's random
//! epoch (a token from a room that no longer exists, say before a restart, matches no room); for
//! an admission token `number` is their position and `at_ms` when they were admitted; for a join
//! challenge (the proof of work before `Join`, [`crate::pow`]) `number` is a random nonce,
//! `at_ms` when it was issued and `epoch` the random instance of the server that issued it.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

type HmacSha256 = Hmac<Sha256>;

const TOKEN_VERSION: u8 = 1;
pub use crate::limits::TOKEN_LEN_MAX;

/// What a token is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenKind {
    /// A place in the waiting room's line (answers `GetStatus`).
    Queue = 1,
    /// Permission to book, for a while (answers `Hold`).
    Admission = 2,
    /// A proof-of-work challenge to solve before one `Join` ([`crate::pow`]).
    JoinChallenge = 3,
}

/// The signed content of a token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claims {
    /// Queue or admission.
    pub kind: TokenKind,
    /// The event it is bound to.
    pub event_id: String,
    /// The user it is bound to.
    pub user_id: String,
    /// Join sequence (queue) or position (admission).
    pub number: u64,
    /// Join time (queue) or admission time (admission), ms since the Unix epoch.
    pub at_ms: u64,
    /// The waiting room's epoch (queue tokens; 0 in admission tokens).
    pub epoch: u64,
    /// After this instant the token is refused as expired.
    pub expires_at_ms: u64,
}

/// Why a token was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenError {
    /// Malformed, forged, of the wrong kind, or for another event or user.
    Invalid,
    /// Well signed but past its expiry.
    Expired,
}

/// Signs and verifies tokens with one secret.
#[derive(Clone)]
pub struct TokenSigner {
    mac: HmacSha256,
}

impl TokenSigner {
    /// A signer with `secret` (any length; 32 random bytes or more recommended).
    pub fn new(secret: &[u8]) -> TokenSigner {
        TokenSigner {
            mac: <HmacSha256 as KeyInit>::new_from_slice(secret)
                .expect("HMAC takes keys of any length"),
        }
    }

    fn tag(&self, payload: &[u8]) -> Vec<u8> {
        let mut mac = self.mac.clone();
        mac.update(payload);
        mac.finalize().into_bytes().to_vec()
    }

    /// The text of a signed `payload`: `base64url(payload) "." base64url(tag)`.
    fn seal(&self, payload: &[u8]) -> String {
        let tag = self.tag(payload);
        format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(payload),
            URL_SAFE_NO_PAD.encode(tag)
        )
    }

    /// The payload and tag of a token this signer sealed ([`TokenSigner::seal`]); `None` if it
    /// is too long, malformed, or its tag is not this secret's (compared in constant time).
    fn open(&self, token: &str) -> Option<(Vec<u8>, Vec<u8>)> {
        if token.len() > TOKEN_LEN_MAX {
            return None;
        }
        let (p64, t64) = token.split_once('.')?;
        let payload = URL_SAFE_NO_PAD.decode(p64).ok()?;
        let tag = URL_SAFE_NO_PAD.decode(t64).ok()?;
        let mut mac = self.mac.clone();
        mac.update(&payload);
        mac.verify_slice(&tag).ok()?;
        Some((payload, tag))
    }

    /// The token text for `claims`.
    pub fn sign(&self, claims: &Claims) -> String {
        let mut p = Vec::with_capacity(32 + claims.event_id.len() + claims.user_id.len());
        p.push(TOKEN_VERSION);
        p.push(claims.kind as u8);
        p.extend_from_slice(&claims.expires_at_ms.to_be_bytes());
        p.extend_from_slice(&claims.number.to_be_bytes());
        p.extend_from_slice(&claims.at_ms.to_be_bytes());
        p.extend_from_slice(&claims.epoch.to_be_bytes());
        for s in [&claims.event_id, &claims.user_id] {
            put_text(&mut p, s);
        }
        self.seal(&p)
    }

    /// Verifies a token's signature and kind; checks it is bound to `event_id` and, when given,
    /// `user_id`; and that it has not expired at `now_ms`.
    pub fn verify(
        &self,
        token: &str,
        kind: TokenKind,
        event_id: Option<&str>,
        user_id: Option<&str>,
        now_ms: u64,
    ) -> Result<Claims, TokenError> {
        self.verify_with_id(token, kind, event_id, user_id, now_ms)
            .map(|(claims, _)| claims)
    }

    /// [`TokenSigner::verify`], also answering the token's id: the first 16 bytes of its tag, a
    /// keyed hash of its whole payload, so two tokens the server signed have the same id only
    /// if they are the same token.
    pub fn verify_with_id(
        &self,
        token: &str,
        kind: TokenKind,
        event_id: Option<&str>,
        user_id: Option<&str>,
        now_ms: u64,
    ) -> Result<(Claims, u128), TokenError> {
        let (payload, tag) = self.open(token).ok_or(TokenError::Invalid)?;
        let claims = parse(&payload).ok_or(TokenError::Invalid)?;
        if claims.kind != kind
            || event_id.is_some_and(|e| e != claims.event_id)
            || user_id.is_some_and(|u| u != claims.user_id)
        {
            return Err(TokenError::Invalid);
        }
        if now_ms >= claims.expires_at_ms {
            return Err(TokenError::Expired);
        }
        let id: [u8; 16] = tag
            .get(..16)
            .and_then(|t| t.try_into().ok())
            .ok_or(TokenError::Invalid)?;
        Ok((claims, u128::from_be_bytes(id)))
    }

    /// The waiting room's shuffle seed for an event: secret until revealed, stable across
    /// restarts (derived from the signing secret), 32 bytes.
    pub fn shuffle_seed(&self, event_id: &str) -> [u8; 32] {
        let mut mac = self.mac.clone();
        mac.update(b"boxoffice shuffle seed\0");
        mac.update(event_id.as_bytes());
        mac.finalize().into_bytes().into()
    }
}

impl TokenSigner {
    /// The epoch of an event's waiting room, signed into its queue tokens: derived from the
    /// event, so every node of a cluster (and a restarted server) gives the same, and a token
    /// keeps its place wherever it is shown.
    pub fn room_epoch(&self, event_id: &str) -> u64 {
        let mut mac = self.mac.clone();
        mac.update(b"boxoffice room epoch\0");
        mac.update(event_id.as_bytes());
        let bytes: [u8; 32] = mac.finalize().into_bytes().into();
        u64::from_be_bytes(bytes[..8].try_into().unwrap_or([0; 8]))
    }
}

/// Where a `ListOrders` page ended, as its `next_page_token` carries it: signed, and bound to
/// the user and the event filter (empty: every event) of the listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OrdersPageToken {
    /// The user listed.
    pub user_id: String,
    /// The event filter (empty: every event).
    pub event_id: String,
    /// The last order shown: its creation time, ms.
    pub created_at_ms: u64,
    /// The last order shown: its id.
    pub order_id: String,
}

/// What a page token's payload starts with: its own kind, so no other token of the server is
/// ever taken for one (the waiting room's start with [`TOKEN_VERSION`] 1).
const ORDERS_PAGE_TAG: &[u8] = b"orders-page:1\0";

impl TokenSigner {
    /// The text of `page`: `base64url(payload) "." base64url(HMAC tag)`, the payload the tag's
    /// kind, the creation time (u64, big-endian), then user, event and order id, each with its
    /// length (u16, big-endian).
    pub fn sign_orders_page(&self, page: &OrdersPageToken) -> String {
        let mut p = ORDERS_PAGE_TAG.to_vec();
        p.extend_from_slice(&page.created_at_ms.to_be_bytes());
        for s in [&page.user_id, &page.event_id, &page.order_id] {
            put_text(&mut p, s);
        }
        self.seal(&p)
    }

    /// The page `token` names, if this server's secret signed it for `user_id` and `event_id`
    /// (the same listing); `None` otherwise (altered, forged, another listing's, not a page
    /// token).
    pub fn verify_orders_page(
        &self,
        token: &str,
        user_id: &str,
        event_id: &str,
    ) -> Option<OrdersPageToken> {
        let (payload, _) = self.open(token)?;
        let rest = payload.strip_prefix(ORDERS_PAGE_TAG)?;
        let (at, mut rest) = rest.split_at_checked(8)?;
        let created_at_ms = u64::from_be_bytes(at.try_into().ok()?);
        let mut text = || -> Option<String> {
            let (len, after) = rest.split_at_checked(2)?;
            let len = usize::from(u16::from_be_bytes(len.try_into().ok()?));
            let (s, after) = after.split_at_checked(len)?;
            rest = after;
            String::from_utf8(s.to_vec()).ok()
        };
        let page = OrdersPageToken {
            created_at_ms,
            user_id: text()?,
            event_id: text()?,
            order_id: text()?,
        };
        (rest.is_empty() && page.user_id == user_id && page.event_id == event_id).then_some(page)
    }
}

/// Appends `s` with its length (u16, big-endian; cut at 65,535 bytes).
fn put_text(p: &mut Vec<u8>, s: &str) {
    let len = u16::try_from(s.len()).unwrap_or(u16::MAX);
    p.extend_from_slice(&len.to_be_bytes());
    p.extend_from_slice(&s.as_bytes()[..usize::from(len)]);
}

/// The event a token names, read without checking its signature: for routing a call to the
/// Raft group of that event only (the node that serves it verifies the token). `None`: not a
/// token's shape.
pub fn event_of_unverified(token: &str) -> Option<String> {
    if token.len() > TOKEN_LEN_MAX {
        return None;
    }
    let (p64, _) = token.split_once('.')?;
    let payload = URL_SAFE_NO_PAD.decode(p64).ok()?;
    parse(&payload).map(|c| c.event_id)
}

/// Hex SHA-256 of a seed: the commitment published before the sale opens.
pub fn seed_commitment(seed: &[u8; 32]) -> String {
    hex::encode(Sha256::digest(seed))
}

fn parse(p: &[u8]) -> Option<Claims> {
    let mut r = Reader { p, at: 0 };
    if r.u8()? != TOKEN_VERSION {
        return None;
    }
    let kind = match r.u8()? {
        1 => TokenKind::Queue,
        2 => TokenKind::Admission,
        3 => TokenKind::JoinChallenge,
        _ => return None,
    };
    let expires_at_ms = r.u64()?;
    let number = r.u64()?;
    let at_ms = r.u64()?;
    let epoch = r.u64()?;
    let event_id = r.string()?;
    let user_id = r.string()?;
    if r.at != p.len() {
        return None;
    }
    Some(Claims {
        kind,
        event_id,
        user_id,
        number,
        at_ms,
        epoch,
        expires_at_ms,
    })
}

struct Reader<'a> {
    p: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let s = self.p.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_be_bytes(self.take(8)?.try_into().ok()?))
    }
    fn string(&mut self) -> Option<String> {
        let len = u16::from_be_bytes(self.take(2)?.try_into().ok()?);
        String::from_utf8(self.take(usize::from(len))?.to_vec()).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_orders_page_token_pages_only_the_listing_it_was_signed_for() {
        let s = TokenSigner::new(b"secret");
        let page = OrdersPageToken {
            user_id: "fan|42".into(),
            event_id: String::new(),
            created_at_ms: 1_234,
            order_id: "e1.g.o01kb".into(),
        };
        let token = s.sign_orders_page(&page);
        assert_eq!(
            s.verify_orders_page(&token, "fan|42", ""),
            Some(page.clone())
        );
        assert_eq!(s.verify_orders_page(&token, "fan|43", ""), None);
        assert_eq!(s.verify_orders_page(&token, "fan|42", "e1"), None);
        let other = TokenSigner::new(b"other secret");
        assert_eq!(other.verify_orders_page(&token, "fan|42", ""), None);
        // Every byte of it counts.
        for at in 0..token.len() {
            let mut bytes = token.clone().into_bytes();
            bytes[at] = if bytes[at] == b'A' { b'B' } else { b'A' };
            let altered = String::from_utf8(bytes).unwrap_or_default();
            if altered != token {
                assert_eq!(
                    s.verify_orders_page(&altered, "fan|42", ""),
                    None,
                    "byte {at}"
                );
            }
        }
        // A waiting room's token, well signed, is not a page token.
        assert_eq!(s.verify_orders_page(&s.sign(&claims()), "fan|42", ""), None);
        // Nor is a page token any waiting room's token.
        for kind in [
            TokenKind::Queue,
            TokenKind::Admission,
            TokenKind::JoinChallenge,
        ] {
            assert_eq!(
                s.verify(&token, kind, None, None, 0),
                Err(TokenError::Invalid)
            );
        }
    }

    fn claims() -> Claims {
        Claims {
            kind: TokenKind::Admission,
            event_id: "e9".into(),
            user_id: "fan|42".into(),
            number: 7,
            at_ms: 1_000,
            epoch: 99,
            expires_at_ms: 5_000,
        }
    }

    #[test]
    fn round_trip_binding_and_expiry() {
        let s = TokenSigner::new(b"secret");
        let t = s.sign(&claims());
        let ok = s.verify(&t, TokenKind::Admission, Some("e9"), Some("fan|42"), 4_999);
        assert_eq!(ok, Ok(claims()));
        assert_eq!(
            s.verify(&t, TokenKind::Admission, Some("e9"), Some("fan|42"), 5_000),
            Err(TokenError::Expired)
        );
        assert_eq!(
            s.verify(&t, TokenKind::Queue, Some("e9"), None, 0),
            Err(TokenError::Invalid),
            "wrong kind"
        );
        assert_eq!(
            s.verify(&t, TokenKind::Admission, Some("e8"), None, 0),
            Err(TokenError::Invalid),
            "other event"
        );
        assert_eq!(
            s.verify(&t, TokenKind::Admission, Some("e9"), Some("fan|43"), 0),
            Err(TokenError::Invalid),
            "other user"
        );
        let other = TokenSigner::new(b"other secret");
        assert_eq!(
            other.verify(&t, TokenKind::Admission, None, None, 0),
            Err(TokenError::Invalid),
            "other key"
        );
    }

    #[test]
    fn every_flipped_bit_is_refused() {
        let s = TokenSigner::new(b"secret");
        let t = s.sign(&claims());
        let bytes = t.as_bytes();
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut b = bytes.to_vec();
                b[i] ^= 1 << bit;
                let Ok(text) = String::from_utf8(b) else {
                    continue;
                };
                if text == t {
                    continue;
                }
                assert!(
                    s.verify(&text, TokenKind::Admission, None, None, 0)
                        .is_err(),
                    "flip {i}:{bit} accepted"
                );
            }
        }
        for junk in ["", ".", "abc", "a.b.c", &"x".repeat(600)] {
            assert_eq!(
                s.verify(junk, TokenKind::Admission, None, None, 0),
                Err(TokenError::Invalid)
            );
        }
    }

    #[test]
    fn shuffle_seed_is_stable_and_committed() {
        let s = TokenSigner::new(b"secret");
        assert_eq!(s.shuffle_seed("e9"), s.shuffle_seed("e9"));
        assert_ne!(s.shuffle_seed("e9"), s.shuffle_seed("e8"));
        assert_eq!(seed_commitment(&s.shuffle_seed("e9")).len(), 64);
    }
}
