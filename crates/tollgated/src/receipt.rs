//! Receipts and leases as callers see them: the store's receipt followed by a keyed MAC of it,
//! its policy and its identity's values. A receipt cannot be forged, edited (more units, another
//! instant) or spent on another identity; `/v1/refund` spends each one once.

use std::{fmt::Write as _, time::Duration};

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tollgate::{
    Acquire, AnyStore, Dimension, DuplicateBy, DuplicateGuard, Fingerprint, Identity, Policy,
    Receipt, Tollgate,
};

/// The bytes of a tag: 128 bits.
const TAG: usize = 16;

/// The key receipts are sealed with: from `server.receipt_key_env` (shared by every instance
/// on one store), or drawn at start (receipts then hold for this process only).
pub(crate) struct ReceiptKey([u8; 32]);

impl ReceiptKey {
    pub(crate) fn random() -> ReceiptKey {
        ReceiptKey(rand::random())
    }

    /// A key from a secret of any length (hashed to 32 bytes).
    pub(crate) fn from_secret(secret: &str) -> ReceiptKey {
        ReceiptKey(Sha256::digest(secret.as_bytes()).into())
    }

    /// `receipt` as callers see it: `<receipt>.<tag>`.
    pub(crate) fn seal(&self, policy: &Policy, identity: &Identity, receipt: &Receipt) -> String {
        let mut text = receipt.to_string();
        let tag = self.tag(policy, identity, &text);
        text.push('.');
        for b in tag {
            let _ = write!(text, "{b:02x}");
        }
        text
    }

    /// The receipt a caller sent back, if it was sealed by this key for this policy and
    /// identity; the error says what is wrong.
    pub(crate) fn open(
        &self,
        policy: &Policy,
        identity: &Identity,
        sealed: &str,
    ) -> Result<(Receipt, [u8; TAG]), String> {
        let (text, tag) = sealed
            .rsplit_once('.')
            .filter(|(_, tag)| tag.len() == 2 * TAG)
            .ok_or("not a receipt this server gave (no seal)")?;
        let mut offered = [0u8; TAG];
        for (i, b) in offered.iter_mut().enumerate() {
            *b = u8::from_str_radix(tag.get(2 * i..2 * i + 2).unwrap_or("x"), 16)
                .map_err(|_| "not a receipt this server gave (bad seal)")?;
        }
        let expected = self.tag(policy, identity, text);
        if !bool::from(expected.ct_eq(&offered)) {
            return Err("not a receipt this server gave for this policy and identity".to_owned());
        }
        let receipt: Receipt = text.parse()?;
        Ok((receipt, expected))
    }

    /// HMAC-SHA256 (RFC 2104) of the policy's scope, the identity's value for each of its
    /// limiters (length-prefixed: no two lists run together) and the receipt text, cut to 128
    /// bits.
    fn tag(&self, policy: &Policy, identity: &Identity, text: &str) -> [u8; TAG] {
        let mut inner = Sha256::new();
        inner.update(pad(&self.0, 0x36));
        let part = |h: &mut Sha256, bytes: &[u8]| {
            h.update((bytes.len() as u64).to_le_bytes());
            h.update(bytes);
        };
        part(&mut inner, policy.scope().as_bytes());
        for limiter in policy.limiters() {
            match limiter.dimension().value(identity) {
                Some(value) => part(&mut inner, value.as_bytes()),
                None => inner.update(u64::MAX.to_le_bytes()),
            }
        }
        part(&mut inner, text.as_bytes());
        let mut outer = Sha256::new();
        outer.update(pad(&self.0, 0x5c));
        outer.update(inner.finalize());
        let mac = outer.finalize();
        let mut tag = [0u8; TAG];
        tag.copy_from_slice(&mac[..TAG]);
        tag
    }
}

fn pad(key: &[u8; 32], byte: u8) -> [u8; 64] {
    let mut block = [byte; 64];
    for (b, k) in block.iter_mut().zip(key) {
        *b ^= k;
    }
    block
}

/// The longest window of `policy`'s rules: after it, a receipt gives nothing back.
pub(crate) fn longest_window(policy: &Policy) -> Duration {
    policy
        .limiters()
        .iter()
        .flat_map(|l| l.rules())
        .map(tollgate::Rule::window)
        .max()
        .unwrap_or_default()
}

impl ReceiptKey {
    /// What names the check of `receipt` whatever its leases became: its tag with the
    /// concurrency limiters' instants left out (an extended lease is sealed anew, the rate
    /// units it charged are the same).
    pub(crate) fn spent_tag(
        &self,
        policy: &Policy,
        identity: &Identity,
        receipt: &Receipt,
    ) -> [u8; TAG] {
        let at = policy.limiters().iter().enumerate().map(|(i, l)| {
            if l.is_concurrent() {
                Receipt::NOT_RECORDED
            } else {
                receipt.at_us(i).unwrap_or(Receipt::NOT_RECORDED)
            }
        });
        let stable = Receipt::per_limiter(at, receipt.id(), receipt.units());
        self.tag(policy, identity, &stable.to_string())
    }
}

/// Marks the receipt of `tag` spent, in the store: true the first time, false after. The mark
/// lives as long as the policy's longest window (after it a refund changes nothing anyway,
/// and older receipts are refused before they come here).
pub(crate) async fn spend(
    gate: &Tollgate<AnyStore>,
    policy: &Policy,
    tag: &[u8; TAG],
) -> Result<bool, tollgate::CheckError> {
    let longest = longest_window(policy);
    let guard = DuplicateGuard::new(
        "tollgate.receipt",
        DuplicateBy::Dimension(Dimension::Arg("receipt".into())),
    )
    .with_ttl(longest + Duration::from_secs(1));
    let mut hex = String::with_capacity(2 * TAG);
    for b in tag {
        let _ = write!(hex, "{b:02x}");
    }
    let who = Identity::new().with_arg("receipt", hex);
    let spent = gate.acquire(&guard, &who, &Fingerprint::empty()).await?;
    Ok(matches!(spent, Acquire::Acquired(_)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate::Limiter;

    #[test]
    fn a_sealed_receipt_opens_only_for_its_policy_and_identity() {
        let key = ReceiptKey::from_secret("a shared secret of some length");
        let policy = Policy::builder("login")
            .limiter(Limiter::new(Dimension::UserId, ["2/1m".parse().unwrap()]))
            .build()
            .unwrap();
        let other = Policy::builder("signup")
            .limiter(Limiter::new(Dimension::UserId, ["2/1m".parse().unwrap()]))
            .build()
            .unwrap();
        let alice = Identity::new().with_user_id("alice");
        let bob = Identity::new().with_user_id("bob");
        let receipt = Receipt::new(1_000_000, 7, 1);
        let sealed = key.seal(&policy, &alice, &receipt);
        let (opened, _) = key.open(&policy, &alice, &sealed).unwrap();
        assert_eq!(opened.to_string(), receipt.to_string());

        assert!(
            key.open(&policy, &bob, &sealed).is_err(),
            "another identity"
        );
        assert!(key.open(&other, &alice, &sealed).is_err(), "another policy");
        let random = ReceiptKey::random();
        assert!(
            random.open(&policy, &alice, &sealed).is_err(),
            "another key"
        );
        // More units, or the bare receipt: refused.
        let edited = sealed.replacen(".1.", ".100.", 1);
        assert_ne!(edited, sealed);
        assert!(key.open(&policy, &alice, &edited).is_err());
        assert!(key.open(&policy, &alice, &receipt.to_string()).is_err());
        assert!(key.open(&policy, &alice, "").is_err());
    }
}
