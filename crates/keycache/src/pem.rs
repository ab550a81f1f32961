//! What a minion key may hold: exactly one PEM public key block and nothing
//! but whitespace around it.
//!
//! The check is structural (the armour lines and a base64 body), not a
//! parse of the key: a key file that Salt keeps and that holds no private
//! material is kept byte for byte, while a file that adds a private key
//! block (in either order), a second block or any other text is refused,
//! so that no command ever stores, prints or exports private key material
//! from the minion banks.

/// The largest public key file or value keycache takes (64 KiB: an RSA
/// key of 16384 bits is under 4 KiB): `migrate` skips a larger file, a
/// snapshot or merge refuses a larger value.
pub const MAX_KEY_BYTES: usize = 64 * 1024;

/// The labels of the public key blocks Salt writes (`PUBLIC KEY` for a
/// SubjectPublicKeyInfo, `RSA PUBLIC KEY` for PKCS#1).
const LABELS: [&str; 2] = ["PUBLIC KEY", "RSA PUBLIC KEY"];

/// Why bytes are not a minion public key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PemProblem {
    /// Empty, or whitespace only.
    Empty,
    /// Not ASCII text.
    NotText,
    /// A private key block (`-----BEGIN ... PRIVATE KEY-----`) anywhere.
    PrivateKey,
    /// No `-----BEGIN PUBLIC KEY-----` (or `RSA PUBLIC KEY`) line first.
    NoPublicKeyBlock,
    /// The block has no matching `-----END ...-----` line.
    Unterminated,
    /// A body line that is not base64, or no body at all.
    BadBody,
    /// Text (or a second block) before or after the block.
    TextOutside,
}

impl PemProblem {
    /// The problem in words, for skip reasons and errors.
    pub fn describe(self) -> &'static str {
        match self {
            PemProblem::Empty => "it is empty",
            PemProblem::NotText => "it is not ASCII text",
            PemProblem::PrivateKey => "it holds a private key block",
            PemProblem::NoPublicKeyBlock => "it does not start with a PEM public key block",
            PemProblem::Unterminated => "its PEM block has no END line",
            PemProblem::BadBody => "its PEM block's body is not base64",
            PemProblem::TextOutside => "it holds more than one PEM public key block",
        }
    }
}

impl std::fmt::Display for PemProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.describe())
    }
}

/// Whether `b` holds a private key block anywhere.
pub fn holds_private_key(b: &[u8]) -> bool {
    // Built once: a merge checks every value of a snapshot (a million at
    // 1M keys), and base64 is full of the 'P' a byte scan stops at.
    static MARK: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"PRIVATE KEY-----"));
    MARK.find(b).is_some()
}

/// Checks that `b` is exactly one PEM public key block, with nothing but
/// whitespace around it.
pub fn check_public_key(b: &[u8]) -> Result<(), PemProblem> {
    if holds_private_key(b) {
        return Err(PemProblem::PrivateKey);
    }
    let Ok(text) = std::str::from_utf8(b) else {
        return Err(PemProblem::NotText);
    };
    if !text.is_ascii() {
        return Err(PemProblem::NotText);
    }
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let Some(first) = lines.next() else {
        return Err(PemProblem::Empty);
    };
    let label = first
        .strip_prefix("-----BEGIN ")
        .and_then(|l| l.strip_suffix("-----"))
        .filter(|l| LABELS.contains(l))
        .ok_or(PemProblem::NoPublicKeyBlock)?;
    let end = format!("-----END {label}-----");
    let mut body = 0usize;
    loop {
        let Some(line) = lines.next() else {
            return Err(PemProblem::Unterminated);
        };
        if line == end {
            break;
        }
        if line.starts_with("-----") {
            return Err(PemProblem::Unterminated);
        }
        if !line
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'+' | b'/' | b'='))
        {
            return Err(PemProblem::BadBody);
        }
        body += line.len();
    }
    if body == 0 {
        return Err(PemProblem::BadBody);
    }
    match lines.next() {
        None => Ok(()),
        Some(_) => Err(PemProblem::TextOutside),
    }
}

/// The fingerprint of a key as Salt 3008.5 gives it for a key of the key
/// cache (`salt.utils.crypt.pem_finger(key=pub)`, what `salt-key -f` prints
/// with the default `hash_type`): the SHA-256 of the key's bytes as stored,
/// in lowercase hex, a `:` after every second digit (`ab:cd:...:ef`).
pub fn finger(pem: &[u8]) -> String {
    use sha2::Digest;
    let d = sha2::Sha256::digest(pem);
    let mut out = String::with_capacity(95);
    for (i, b) in d.iter().enumerate() {
        if i > 0 {
            out.push(':');
        }
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// A fingerprint as an operator gives it (`salt-key -f`'s form, or the same
/// digits without colons, any case), normalized to [`finger`]'s form; None
/// when it is not 64 hex digits.
pub fn parse_finger(s: &str) -> Option<String> {
    let digits: String = s
        .trim()
        .chars()
        .filter(|c| *c != ':')
        .map(|c| c.to_ascii_lowercase())
        .collect();
    if digits.len() != 64 || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let pairs: Vec<&str> = (0..32).map(|i| &digits[2 * i..2 * i + 2]).collect();
    Some(pairs.join(":"))
}

/// Refuses a change of `id` guarded by the fingerprint `expected` (in
/// [`finger`]'s form) unless the key held, `held` (None: no key), is the
/// one whose fingerprint that is: [`crate::Error::FingerMismatch`], naming
/// both.
pub fn check_finger(id: &str, held: Option<&[u8]>, expected: &str) -> crate::Result<()> {
    let found = held.map(finger);
    if found.as_deref() == Some(expected) {
        return Ok(());
    }
    Err(crate::Error::FingerMismatch {
        id: id.to_owned(),
        expected: expected.to_owned(),
        found,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Salt's `pem_finger`: SHA-256 of the bytes, hex pairs with colons
    /// (the digest of "abc" is FIPS 180-2's example); given with or
    /// without colons, in any case, it reads back in that form.
    #[test]
    fn fingerprints_are_salts_and_read_back_in_any_form() {
        let f = finger(b"abc");
        assert_eq!(
            f,
            "ba:78:16:bf:8f:01:cf:ea:41:41:40:de:5d:ae:22:23:b0:03:61:a3:96:17:7a:9c:b4:10:ff:61:\
             f2:00:15:ad"
        );
        assert_eq!(parse_finger(&f).as_deref(), Some(f.as_str()));
        let plain = f.replace(':', "").to_uppercase();
        assert_eq!(parse_finger(&plain).as_deref(), Some(f.as_str()));
        assert_eq!(parse_finger("ba:78"), None);
        assert_eq!(parse_finger(&format!("{}zz", &plain[..62])), None);
        assert!(check_finger("m", Some(b"abc"), &f).is_ok());
        let e = check_finger("m", Some(b"abd"), &f).expect_err("another key");
        assert!(e.to_string().contains(&f), "{e}");
        assert!(check_finger("m", None, &f).is_err());
    }

    const PUB: &str = "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEAu1SU1LfVLPHCozMxH2Mo\n4lgOEePzNm0tRgeLezV6ffAt0gunVTLw7onLRnrq0/IzW7yWR7QkrmBL7jTKEn5u\n+wIDAQAB\n-----END PUBLIC KEY-----\n";
    const PRIV: &str = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----\n";

    #[test]
    fn one_public_block_with_whitespace_around_is_a_key() {
        assert_eq!(check_public_key(PUB.as_bytes()), Ok(()));
        let crlf = PUB.replace('\n', "\r\n");
        assert_eq!(
            check_public_key(format!("\n  {crlf}\n\n").as_bytes()),
            Ok(())
        );
        let rsa = PUB.replace("PUBLIC KEY", "RSA PUBLIC KEY");
        assert_eq!(check_public_key(rsa.as_bytes()), Ok(()));
    }

    #[test]
    fn private_material_in_any_order_is_refused() {
        for b in [
            format!("{PUB}{PRIV}"),
            format!("{PRIV}{PUB}"),
            PRIV.to_string(),
            PRIV.replace("PRIVATE KEY", "RSA PRIVATE KEY"),
            PRIV.replace("PRIVATE KEY", "ENCRYPTED PRIVATE KEY"),
            format!("{PUB}\n{}", PRIV.replace("PRIVATE KEY", "EC PRIVATE KEY")),
        ] {
            assert_eq!(
                check_public_key(b.as_bytes()),
                Err(PemProblem::PrivateKey),
                "{b}"
            );
            assert!(holds_private_key(b.as_bytes()));
        }
        assert!(!holds_private_key(PUB.as_bytes()));
    }

    #[test]
    fn anything_else_is_refused_with_its_reason() {
        let cases = [
            ("", PemProblem::Empty),
            (" \n\t\n", PemProblem::Empty),
            ("junk", PemProblem::NoPublicKeyBlock),
            (
                "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
                PemProblem::NoPublicKeyBlock,
            ),
            (
                "-----BEGIN PUBLIC KEY-----\nAAAA\n",
                PemProblem::Unterminated,
            ),
            (
                "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END RSA PUBLIC KEY-----\n",
                PemProblem::Unterminated,
            ),
            (
                "-----BEGIN PUBLIC KEY-----\n-----END PUBLIC KEY-----\n",
                PemProblem::BadBody,
            ),
            (
                "-----BEGIN PUBLIC KEY-----\nAA AA\n-----END PUBLIC KEY-----\n",
                PemProblem::BadBody,
            ),
        ];
        for (b, want) in cases {
            assert_eq!(check_public_key(b.as_bytes()), Err(want), "{b:?}");
        }
        assert_eq!(
            check_public_key(format!("{PUB}{PUB}").as_bytes()),
            Err(PemProblem::TextOutside)
        );
        assert_eq!(
            check_public_key(format!("comment\n{PUB}").as_bytes()),
            Err(PemProblem::NoPublicKeyBlock)
        );
        assert_eq!(
            check_public_key(format!("{PUB}trailer").as_bytes()),
            Err(PemProblem::TextOutside)
        );
        assert_eq!(
            check_public_key(
                "-----BEGIN PUBLIC KEY-----\nAAé\n-----END PUBLIC KEY-----".as_bytes()
            ),
            Err(PemProblem::NotText)
        );
        assert_eq!(check_public_key(&[0xff, 0xfe]), Err(PemProblem::NotText));
    }
}
