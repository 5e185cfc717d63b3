//! TLS for the Postgres connection, chosen by the URL's `sslmode`:
//!
//! - `disable`: plain TCP.
//! - `prefer` (libpq's default) and `require`: TLS; with `prefer` a server without
//!   TLS is accepted in the clear. As with libpq, these modes do not verify the
//!   server's certificate unless a CA is given.
//! - With `--database-ca FILE` (`ENVELOPES_DATABASE_CA`) the certificate is
//!   verified against that CA and the host name, in every TLS mode.

use std::path::PathBuf;
use std::sync::OnceLock;

static DATABASE_CA: OnceLock<PathBuf> = OnceLock::new();

/// Sets the CA that server certificates must chain to (once, at startup).
pub fn set_database_ca(path: PathBuf) {
    let _ = DATABASE_CA.set(path);
}

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use std::sync::Arc;
use tokio_postgres::config::SslMode;
use tokio_postgres::Config;
use tokio_postgres_rustls::MakeRustlsConnect;

/// The connector to use, or `None` for a plain connection.
pub fn connector(config: &Config) -> Result<Option<MakeRustlsConnect>, String> {
    if config.get_ssl_mode() == SslMode::Disable {
        return Ok(None);
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let tls = match DATABASE_CA.get() {
        Some(path) => {
            let mut roots = RootCertStore::empty();
            for cert in CertificateDer::pem_file_iter(path)
                .map_err(|e| format!("{}: {e}", path.display()))?
            {
                roots
                    .add(cert.map_err(|e| e.to_string())?)
                    .map_err(|e| e.to_string())?;
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        }
        None => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(EncryptOnly(provider)))
            .with_no_client_auth(),
    };
    Ok(Some(MakeRustlsConnect::new(tls)))
}

/// libpq's `sslmode=require` without a CA: encrypt, but accept any certificate.
/// Signatures are still checked, so the session is with the key the certificate
/// names; only the certificate's issuer is not.
#[derive(Debug)]
struct EncryptOnly(Arc<CryptoProvider>);

impl ServerCertVerifier for EncryptOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
