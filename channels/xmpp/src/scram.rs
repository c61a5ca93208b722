//! SASL SCRAM (RFC 5802) for XMPP logins, SHA-1 and SHA-256, on ring's HMAC and PBKDF2: the
//! client side of one exchange, including the check of the server's signature (a server that
//! does not know the password is refused). Must not: log the password or the proof.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use ring::{digest, hmac, pbkdf2};
use std::num::NonZeroU32;

/// A SCRAM variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mechanism {
    /// `SCRAM-SHA-256` (preferred when offered).
    Sha256,
    /// `SCRAM-SHA-1`.
    Sha1,
}

impl Mechanism {
    /// Its SASL name.
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Sha256 => "SCRAM-SHA-256",
            Mechanism::Sha1 => "SCRAM-SHA-1",
        }
    }

    fn algs(
        self,
    ) -> (
        hmac::Algorithm,
        pbkdf2::Algorithm,
        &'static digest::Algorithm,
    ) {
        match self {
            Mechanism::Sha256 => (
                hmac::HMAC_SHA256,
                pbkdf2::PBKDF2_HMAC_SHA256,
                &digest::SHA256,
            ),
            Mechanism::Sha1 => (
                hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY,
                pbkdf2::PBKDF2_HMAC_SHA1,
                &digest::SHA1_FOR_LEGACY_USE_ONLY,
            ),
        }
    }
}

/// What went wrong in the exchange (the server's words or ours).
#[derive(Debug, PartialEq, Eq)]
pub struct ScramError(pub String);

/// One client exchange.
pub struct Scram {
    mech: Mechanism,
    client_first_bare: String,
    nonce: String,
    server_signature: Option<Vec<u8>>,
}

fn saslname(user: &str) -> String {
    user.replace('=', "=3D").replace(',', "=2C")
}

impl Scram {
    /// Start: the client-first message (base64, for `<auth>`) and the exchange.
    pub fn start(mech: Mechanism, user: &str, nonce: &str) -> (Self, String) {
        let bare = format!("n={},r={nonce}", saslname(user));
        let first = B64.encode(format!("n,,{bare}"));
        (
            Self {
                mech,
                client_first_bare: bare,
                nonce: nonce.to_string(),
                server_signature: None,
            },
            first,
        )
    }

    /// Answer the server-first challenge (base64): the client-final message (base64).
    ///
    /// # Errors
    /// A challenge that is not SCRAM, a nonce that does not extend ours, too few iterations.
    pub fn respond(&mut self, challenge_b64: &str, password: &str) -> Result<String, ScramError> {
        let server_first = B64
            .decode(challenge_b64.trim())
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
            .ok_or_else(|| ScramError("the server's challenge is not base64 text".into()))?;
        let field = |k: &str| {
            server_first
                .split(',')
                .find_map(|f| f.strip_prefix(k).and_then(|v| v.strip_prefix('=')))
        };
        let nonce = field("r").ok_or_else(|| ScramError("no nonce in the challenge".into()))?;
        if !nonce.starts_with(&self.nonce) || nonce.len() == self.nonce.len() {
            return Err(ScramError("the server's nonce does not extend ours".into()));
        }
        let salt = field("s")
            .and_then(|s| B64.decode(s).ok())
            .ok_or_else(|| ScramError("no salt in the challenge".into()))?;
        let iters: u32 = field("i")
            .and_then(|i| i.parse().ok())
            .ok_or_else(|| ScramError("no iteration count in the challenge".into()))?;
        if iters < 4096 {
            return Err(ScramError(format!(
                "the server asks for {iters} iterations, fewer than SCRAM's minimum of 4096"
            )));
        }
        let (h, p, d) = self.mech.algs();
        let mut salted = vec![0u8; d.output_len()];
        let n = NonZeroU32::new(iters).ok_or_else(|| ScramError("zero iterations".into()))?;
        pbkdf2::derive(p, n, &salt, password.as_bytes(), &mut salted);
        let key = hmac::Key::new(h, &salted);
        let client_key = hmac::sign(&key, b"Client Key");
        let stored = digest::digest(d, client_key.as_ref());
        let without_proof = format!("c=biws,r={nonce}");
        let auth_message = format!("{},{server_first},{without_proof}", self.client_first_bare);
        let sig = hmac::sign(&hmac::Key::new(h, stored.as_ref()), auth_message.as_bytes());
        let proof: Vec<u8> = client_key
            .as_ref()
            .iter()
            .zip(sig.as_ref())
            .map(|(a, b)| a ^ b)
            .collect();
        let server_key = hmac::sign(&key, b"Server Key");
        let server_sig = hmac::sign(
            &hmac::Key::new(h, server_key.as_ref()),
            auth_message.as_bytes(),
        );
        self.server_signature = Some(server_sig.as_ref().to_vec());
        Ok(B64.encode(format!("{without_proof},p={}", B64.encode(proof))))
    }

    /// Check the server's final message (base64 of `v=…`, carried by `<success>`).
    ///
    /// # Errors
    /// The server did not prove it knows the password.
    pub fn verify(&self, success_b64: &str) -> Result<(), ScramError> {
        let text = B64
            .decode(success_b64.trim())
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
            .unwrap_or_default();
        let v = text
            .split(',')
            .find_map(|f| f.strip_prefix("v="))
            .and_then(|v| B64.decode(v).ok());
        match (&self.server_signature, v) {
            (Some(ours), Some(theirs)) if *ours == theirs => Ok(()),
            _ => Err(ScramError(
                "the server's SCRAM signature is wrong: it does not know the password (a man in the middle?)".into(),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// RFC 5802 §5's example exchange (user, password, nonces and salt from the RFC).
    #[test]
    fn the_rfc_example_exchange_gives_the_rfc_proof_and_checks_the_server() {
        let (mut s, first) = Scram::start(Mechanism::Sha1, "user", "fyko+d2lbbFgONRv9qkxdawL");
        assert_eq!(
            B64.decode(first).unwrap(),
            b"n,,n=user,r=fyko+d2lbbFgONRv9qkxdawL"
        );
        let challenge =
            B64.encode("r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,s=QSXCR+Q6sek8bf92,i=4096");
        let fin = s.respond(&challenge, "pencil").unwrap();
        assert_eq!(
            String::from_utf8(B64.decode(fin).unwrap()).unwrap(),
            "c=biws,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,p=v0X8v3Bz2T0CJGbJQyF0X+HI4Ts="
        );
        assert!(s
            .verify(&B64.encode("v=rmF9pqV8S7suAoZWja4dJRkFsKQ="))
            .is_ok());
        assert!(s.verify(&B64.encode("v=AAAA")).is_err());
    }

    #[test]
    fn a_nonce_that_does_not_extend_ours_is_refused() {
        let (mut s, _) = Scram::start(Mechanism::Sha256, "u", "abc");
        let c = B64.encode("r=xyz123,s=QSXCR+Q6sek8bf92,i=4096");
        assert!(s.respond(&c, "p").is_err());
    }
}
