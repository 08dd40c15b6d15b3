//! A cluster's certificates, as `boxoffice cluster certs` makes them: the cluster's own CA, and
//! for each node a certificate it signed, for the peer port's mutual TLS ([`crate::tls`]).
//!
//! - `ca.pem` and `ca.key`: the CA. If both are in the folder already they are used, so a node
//!   added later gets a certificate of the same cluster. Keep `ca.key` off the nodes.
//! - `node-N.pem` and `node-N.key`: node N's certificate and key. It names every host given
//!   for the node (an IP address or a DNS name: the host the other nodes dial in `--peers`),
//!   and `node-N`. It serves both as server and as client: a node is both to its peers.
//!
//! Files that exist are never overwritten. Keys are written with mode 0600.

use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow, ensure};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use time::{Duration, OffsetDateTime};

/// One node to make a certificate for: its id and the hosts it is reached at.
#[derive(Clone, Debug)]
pub struct NodeHosts {
    /// The node's id (`--node-id`).
    pub id: u64,
    /// The IP addresses or DNS names its peers dial it at.
    pub hosts: Vec<String>,
}

/// When the certificates made are valid: from `from` for `days` days.
#[derive(Clone, Copy, Debug)]
pub struct Validity {
    /// The first moment they are valid.
    pub from: OffsetDateTime,
    /// How many days they stay valid.
    pub days: u32,
}

impl Validity {
    /// From an hour ago (clocks differ a little between machines) for `days` days.
    pub fn days(days: u32) -> Validity {
        Validity {
            from: OffsetDateTime::now_utc() - Duration::hours(1),
            days,
        }
    }

    fn apply(&self, params: &mut CertificateParams) {
        params.not_before = self.from;
        params.not_after = self.from + Duration::days(i64::from(self.days));
    }
}

/// What [`make`] wrote, and whether it made the CA or used the one there.
#[derive(Debug)]
pub struct Made {
    /// The files written, CA first.
    pub written: Vec<PathBuf>,
    /// Whether the CA was made now (else the folder's was used).
    pub new_ca: bool,
}

/// Writes the CA (unless `dir` has one) and each of `nodes`' certificate and key into `dir`.
pub fn make(dir: &Path, nodes: &[NodeHosts], validity: Validity) -> anyhow::Result<Made> {
    ensure!(!nodes.is_empty(), "no node to make a certificate for");
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for n in nodes {
        ensure!(!n.hosts.is_empty(), "node {} has no host", n.id);
        for f in [node_file(dir, n.id, "pem"), node_file(dir, n.id, "key")] {
            ensure!(
                !f.exists(),
                "{} exists: it is never overwritten (remove it to make a new one)",
                f.display()
            );
        }
    }
    let mut written = Vec::new();
    let (ca_pem, ca_key) = (dir.join("ca.pem"), dir.join("ca.key"));
    let new_ca = !(ca_pem.exists() && ca_key.exists());
    let (ca_params, key) = if new_ca {
        ensure!(
            !ca_pem.exists() && !ca_key.exists(),
            "{} has one of ca.pem and ca.key but not the other",
            dir.display()
        );
        let (params, key, pem) = new_authority(validity)?;
        write(&ca_pem, pem.as_bytes(), false)?;
        write(&ca_key, key.serialize_pem().as_bytes(), true)?;
        written.extend([ca_pem.clone(), ca_key.clone()]);
        (Some(params), key)
    } else {
        let key = KeyPair::from_pem(&read(&ca_key)?)
            .map_err(|e| anyhow!("{}: not a PEM private key ({e})", ca_key.display()))?;
        (None, key)
    };
    let issuer = match ca_params {
        Some(params) => Issuer::new(params, &key),
        None => Issuer::from_ca_cert_pem(&read(&ca_pem)?, &key)
            .map_err(|e| anyhow!("{}: not a usable CA certificate ({e})", ca_pem.display()))?,
    };
    for n in nodes {
        let (cert, key) = node_certificate(n, &issuer, validity)?;
        let (pem, key_file) = (node_file(dir, n.id, "pem"), node_file(dir, n.id, "key"));
        write(&pem, cert.as_bytes(), false)?;
        write(&key_file, key.as_bytes(), true)?;
        written.extend([pem, key_file]);
    }
    Ok(Made { written, new_ca })
}

/// Node `id`'s certificate (`pem`) or key (`key`) file in `dir`.
pub fn node_file(dir: &Path, id: u64, ext: &str) -> PathBuf {
    dir.join(format!("node-{id}.{ext}"))
}

/// A new CA: its parameters, key and certificate (PEM).
fn new_authority(validity: Validity) -> anyhow::Result<(CertificateParams, KeyPair, String)> {
    let key = KeyPair::generate().context("a CA key")?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, "boxoffice cluster CA");
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    validity.apply(&mut params);
    let cert = params.self_signed(&key).context("signing the CA")?;
    Ok((params, key, cert.pem()))
}

/// Node `n`'s certificate signed by `issuer`, and its key (both PEM).
fn node_certificate(
    n: &NodeHosts,
    issuer: &Issuer<'_, &KeyPair>,
    validity: Validity,
) -> anyhow::Result<(String, String)> {
    let key = KeyPair::generate().context("a node key")?;
    let mut names = n.hosts.clone();
    names.push(format!("node-{}", n.id));
    let mut params = CertificateParams::new(names).map_err(|e| {
        anyhow!(
            "node {}: a host is not an IP address or DNS name ({e})",
            n.id
        )
    })?;
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, format!("boxoffice node {}", n.id));
    params.distinguished_name = name;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.use_authority_key_identifier_extension = true;
    validity.apply(&mut params);
    let cert = params
        .signed_by(&key, issuer)
        .with_context(|| format!("signing node {}'s certificate", n.id))?;
    Ok((cert.pem(), key.serialize_pem()))
}

fn read(path: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

/// Writes `bytes` to a new file `path` (mode 0600 if `secret`).
fn write(path: &Path, bytes: &[u8], secret: bool) -> anyhow::Result<()> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    if secret {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let _ = secret;
    let mut f = options
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::PeerTls;

    fn node(id: u64) -> NodeHosts {
        NodeHosts {
            id,
            hosts: vec!["127.0.0.1".into()],
        }
    }

    #[test]
    fn certificates_made_load_as_the_peer_ports_tls() {
        let dir = tempfile::tempdir().unwrap();
        let made = make(dir.path(), &[node(1), node(2)], Validity::days(30)).unwrap();
        assert!(made.new_ca);
        assert_eq!(made.written.len(), 6);
        let ca = dir.path().join("ca.pem");
        for id in [1, 2] {
            PeerTls::load(
                &ca,
                &node_file(dir.path(), id, "pem"),
                &node_file(dir.path(), id, "key"),
            )
            .unwrap();
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join("ca.key"))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    #[test]
    fn a_node_added_later_is_signed_by_the_same_ca() {
        let dir = tempfile::tempdir().unwrap();
        make(dir.path(), &[node(1)], Validity::days(30)).unwrap();
        let ca_before = std::fs::read(dir.path().join("ca.pem")).unwrap();
        let made = make(dir.path(), &[node(4)], Validity::days(30)).unwrap();
        assert!(!made.new_ca);
        assert_eq!(std::fs::read(dir.path().join("ca.pem")).unwrap(), ca_before);
        PeerTls::load(
            &dir.path().join("ca.pem"),
            &node_file(dir.path(), 4, "pem"),
            &node_file(dir.path(), 4, "key"),
        )
        .unwrap();
    }

    #[test]
    fn existing_files_are_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        make(dir.path(), &[node(1)], Validity::days(30)).unwrap();
        let before = std::fs::read(node_file(dir.path(), 1, "key")).unwrap();
        let e = make(dir.path(), &[node(2), node(1)], Validity::days(30))
            .unwrap_err()
            .to_string();
        assert!(e.contains("never overwritten"), "{e}");
        assert_eq!(
            std::fs::read(node_file(dir.path(), 1, "key")).unwrap(),
            before
        );
        // Nothing of node 2 either: the check comes before any write.
        assert!(!node_file(dir.path(), 2, "pem").exists());
    }
}
