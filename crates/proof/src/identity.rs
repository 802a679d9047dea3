//! A node's secret key: created at random on first run, kept in a key file readable only by
//! the owner, never derived from a password and never sent anywhere.
//!
//! One key serves three roles, so they cannot drift apart:
//! - the ledger account and [`NodeId`] (BLAKE3 of the compressed public key);
//! - every signature the node makes (proofs, transfers, receipts, [`crate::Signed`] envelopes);
//! - the libp2p transport identity: the network layer builds its keypair with
//!   `libp2p::identity::secp256k1::SecretKey::try_from_bytes(identity.secret_bytes())`, so the
//!   peer id is derived from this same secp256k1 key. (This crate does not depend on libp2p.)
//!
//! Key file format: 64 lowercase hex characters (the 32-byte scalar) and a newline.

use std::fmt;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use k256::ecdsa::SigningKey;
use rand::{CryptoRng, RngCore, TryRngCore};

use crate::keys::{NodeId, PublicKey, Signature, sha256};

/// File name of the node key inside a node's data directory.
pub const KEY_FILE: &str = "node.key";

/// Why an identity could not be created, loaded or saved.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("secret key is zero or not below the secp256k1 group order")]
    InvalidSecret,
    #[error("key file {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("key file {path} is not 64 hex characters")]
    BadKeyFile { path: PathBuf },
    #[error("key file {path} is readable by others (mode {mode:o}); run chmod 600 on it")]
    InsecurePermissions { path: PathBuf, mode: u32 },
    #[error("signing failed")]
    Signing,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> IdentityError + '_ {
    move |source| IdentityError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The node's signing key. `Debug` shows only the node id.
#[derive(Clone)]
pub struct Identity {
    /// Signed with libsecp256k1, which makes the bytes k256 would (RFC 6979 nonces, low S:
    /// `keys::tests::signatures_match_k256`) a little faster.
    secret: secp256k1::SecretKey,
    public: PublicKey,
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Identity")
            .field("node_id", &self.node_id())
            .finish_non_exhaustive()
    }
}

impl Identity {
    /// A fresh random key drawn from the operating system's CSPRNG.
    pub fn generate() -> Identity {
        Self::generate_with(&mut rand::rngs::OsRng.unwrap_err())
    }

    /// A fresh key from the given cryptographic RNG (seeded RNGs make reproducible test keys).
    pub fn generate_with<R: CryptoRng + RngCore + ?Sized>(rng: &mut R) -> Identity {
        // Rejection sampling: a uniformly random 32-byte string is a valid scalar except with
        // probability ~2^-128, so this loop runs once in practice.
        loop {
            let mut bytes = [0u8; 32];
            rng.fill_bytes(&mut bytes);
            if let Ok(id) = Self::from_secret_bytes(&bytes) {
                return id;
            }
        }
    }

    pub fn from_secret_bytes(bytes: &[u8; 32]) -> Result<Identity, IdentityError> {
        let key = SigningKey::from_slice(bytes).map_err(|_| IdentityError::InvalidSecret)?;
        let secret = secp256k1::SecretKey::from_secret_bytes(*bytes)
            .map_err(|_| IdentityError::InvalidSecret)?;
        let public = PublicKey::from_verifying_key(key.verifying_key());
        Ok(Identity { secret, public })
    }

    /// Loads the key file, or creates it (mode 0600) with a fresh random key if absent.
    /// Creation is atomic and never overwrites: if two processes race, both end up with the
    /// key that reached the disk first.
    pub fn load_or_create(path: &Path) -> Result<Identity, IdentityError> {
        match Self::load(path) {
            Err(IdentityError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound => {}
            other => return other,
        }
        let identity = Self::generate();
        identity.save_new(path)?;
        Self::load(path)
    }

    /// Loads an existing key file; refuses files that group or others can read.
    pub fn load(path: &Path) -> Result<Identity, IdentityError> {
        let meta = fs::metadata(path).map_err(io_err(path))?;
        check_permissions(path, &meta)?;
        let text = fs::read_to_string(path).map_err(io_err(path))?;
        let bad = || IdentityError::BadKeyFile {
            path: path.to_path_buf(),
        };
        let bytes = hex::decode(text.trim()).map_err(|_| bad())?;
        let arr: [u8; 32] = bytes.as_slice().try_into().map_err(|_| bad())?;
        Self::from_secret_bytes(&arr)
    }

    /// Writes this key to a new file at `path` (0600), failing if one already exists.
    pub fn save_new(&self, path: &Path) -> Result<(), IdentityError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            fs::create_dir_all(dir).map_err(io_err(dir))?;
        }
        // Write a private temp file, fsync, then hard-link it into place: link() refuses to
        // replace an existing file, so a concurrent creator cannot clobber a key in use.
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let result = (|| {
            let mut opts = OpenOptions::new();
            opts.write(true).create_new(true);
            #[cfg(unix)]
            {
                use std::os::unix::fs::OpenOptionsExt;
                opts.mode(0o600);
            }
            let mut file = opts.open(&tmp).map_err(io_err(&tmp))?;
            file.write_all(format!("{}\n", hex::encode(self.secret_bytes())).as_bytes())
                .map_err(io_err(&tmp))?;
            file.sync_all().map_err(io_err(&tmp))?;
            match fs::hard_link(&tmp, path) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
                Err(e) => Err(io_err(path)(e)),
            }
        })();
        let _ = fs::remove_file(&tmp);
        result
    }

    pub fn public_key(&self) -> PublicKey {
        self.public
    }

    pub fn node_id(&self) -> NodeId {
        self.public.node_id()
    }

    /// ECDSA over SHA-256(`msg`) with RFC 6979 deterministic nonces, normalized to low-S.
    pub fn sign(&self, msg: &[u8]) -> Signature {
        self.sign_prehash(&sha256(msg))
    }

    pub(crate) fn sign_prehash(&self, prehash: &[u8; 32]) -> Signature {
        // libsecp256k1 signs with low S always.
        let msg = secp256k1::Message::from_digest(*prehash);
        Signature(secp256k1::ecdsa::sign(msg, &self.secret).serialize_compact())
    }

    /// The raw secret scalar. Only for deriving the libp2p keypair from the same key; never
    /// log, send or persist it anywhere but the key file.
    pub fn secret_bytes(&self) -> [u8; 32] {
        self.secret.to_secret_bytes()
    }
}

#[cfg(unix)]
fn check_permissions(path: &Path, meta: &fs::Metadata) -> Result<(), IdentityError> {
    use std::os::unix::fs::PermissionsExt;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(IdentityError::InsecurePermissions {
            path: path.to_path_buf(),
            mode,
        });
    }
    Ok(())
}

#[cfg(not(unix))]
fn check_permissions(_path: &Path, _meta: &fs::Metadata) -> Result<(), IdentityError> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::SignatureError;
    use rand::SeedableRng;

    fn seeded(seed: u64) -> Identity {
        Identity::generate_with(&mut rand_chacha::ChaCha20Rng::seed_from_u64(seed))
    }

    #[test]
    fn sign_verify_roundtrip_and_low_s() {
        let id = seeded(1);
        for i in 0..64u32 {
            let msg = i.to_le_bytes();
            let sig = id.sign(&msg);
            assert!(!sig.is_high_s());
            assert_eq!(id.public_key().verify(&msg, &sig), Ok(()));
            assert_eq!(
                id.public_key().verify(b"other", &sig),
                Err(SignatureError::Mismatch)
            );
        }
    }

    #[test]
    fn malleated_signature_is_rejected_as_high_s() {
        let id = seeded(2);
        let sig = id.sign(b"proof");
        let twin = sig.malleate();
        assert_ne!(twin, sig);
        assert!(twin.is_high_s());
        assert_eq!(twin.malleate(), sig);
        assert_eq!(
            id.public_key().verify(b"proof", &twin),
            Err(SignatureError::HighS)
        );
    }

    #[test]
    fn node_id_is_blake3_of_compressed_key() {
        let id = seeded(3);
        let pk = id.public_key().to_bytes();
        assert_eq!(pk.len(), 33);
        assert_eq!(id.node_id().0, *blake3::hash(&pk).as_bytes());
        assert_eq!(id.public_key().node_id(), id.node_id());
    }

    #[test]
    fn secret_roundtrip_and_invalid_secrets() {
        let id = seeded(4);
        let back = Identity::from_secret_bytes(&id.secret_bytes());
        assert!(matches!(back, Ok(ref b) if b.public_key() == id.public_key()));
        assert!(matches!(
            Identity::from_secret_bytes(&[0u8; 32]),
            Err(IdentityError::InvalidSecret)
        ));
        assert!(matches!(
            Identity::from_secret_bytes(&[0xffu8; 32]),
            Err(IdentityError::InvalidSecret)
        ));
    }

    #[test]
    fn debug_does_not_leak_secret() {
        let id = seeded(5);
        let text = format!("{id:?}");
        assert!(!text.contains(&hex::encode(id.secret_bytes())));
        assert!(text.contains(&id.node_id().to_string()));
    }

    #[test]
    fn key_file_created_private_and_reloaded() -> Result<(), IdentityError> {
        let dir = tempfile::tempdir().map_err(io_err(Path::new("tmp")))?;
        let path = dir.path().join("sub").join("node.key");
        let first = Identity::load_or_create(&path)?;
        let again = Identity::load_or_create(&path)?;
        assert_eq!(first.node_id(), again.node_id());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(&path)
                .map_err(io_err(&path))?
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
            fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).map_err(io_err(&path))?;
            assert!(matches!(
                Identity::load(&path),
                Err(IdentityError::InsecurePermissions { .. })
            ));
        }
        Ok(())
    }

    #[test]
    fn garbage_key_file_is_an_error() -> Result<(), IdentityError> {
        let dir = tempfile::tempdir().map_err(io_err(Path::new("tmp")))?;
        let path = dir.path().join("node.key");
        seeded(6).save_new(&path)?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            fs::write(&path, "not hex").map_err(io_err(&path))?;
            fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).map_err(io_err(&path))?;
        }
        assert!(matches!(
            Identity::load(&path),
            Err(IdentityError::BadKeyFile { .. })
        ));
        Ok(())
    }

    #[test]
    fn hex_text_and_serde_roundtrip() {
        let id = seeded(7);
        let pk = id.public_key();
        let sig = id.sign(b"x");
        let nid = id.node_id();
        assert_eq!(pk.to_string().parse::<PublicKey>(), Ok(pk));
        assert_eq!(sig.to_string().parse::<Signature>(), Ok(sig));
        assert_eq!(nid.to_string().parse::<NodeId>(), Ok(nid));
        let json = serde_json::to_string(&(pk, sig, nid)).unwrap_or_default();
        let back: Result<(PublicKey, Signature, NodeId), _> = serde_json::from_str(&json);
        assert_eq!(back.ok(), Some((pk, sig, nid)));
        assert_eq!(nid.to_string(), nid.to_string().to_lowercase());
    }
}
