//! A Postgres server of a test's own, for what the shared test server must not
//! see: a restart, a crash, a failover. It runs as `postgres` (the server refuses
//! root) under `ENVELOPES_TMP`, on a free port, with the installed extension, and
//! is stopped and removed on drop.

use super::{free_port, unique};
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// The server binaries: scripts/lib.sh's (`PG_BIN`), or Debian's.
fn pg_bin() -> String {
    std::env::var("PG_BIN").unwrap_or_else(|_| "/usr/lib/postgresql/15/bin".into())
}

pub struct Cluster {
    pub dir: PathBuf,
    pub port: u16,
}

/// Runs a server program as `postgres` (or as is, when the tests already run
/// as someone else), panicking with its output when it fails.
fn as_postgres(program: &str, args: &[&str]) {
    let path = format!("{}/{program}", pg_bin());
    let root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false);
    let mut cmd = if root {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--", &path]);
        c
    } else {
        Command::new(&path)
    };
    let out = cmd
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Cluster {
    /// A fresh server with `settings` appended to postgresql.conf, started.
    pub fn start(label: &str, settings: &[&str]) -> Cluster {
        let base = PathBuf::from(
            std::env::var("ENVELOPES_TMP").unwrap_or_else(|_| "/var/tmp/pg_envelopes".into()),
        );
        let dir = base.join(unique(&format!("bt_{label}_")));
        std::fs::create_dir_all(&dir).unwrap();
        let _ = Command::new("chown")
            .args(["postgres:postgres", dir.to_str().unwrap()])
            .status();
        let data = dir.join("data");
        as_postgres(
            "initdb",
            &[
                "-D",
                data.to_str().unwrap(),
                "--auth=trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--locale=C.UTF-8",
            ],
        );
        let port = free_port();
        let mut conf = format!(
            "listen_addresses = '127.0.0.1'\nport = {port}\nunix_socket_directories = '{}'\n\
             max_connections = 50\nfsync = off\n",
            dir.display()
        );
        for s in settings {
            conf.push_str(s);
            conf.push('\n');
        }
        let path = data.join("postgresql.conf");
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str(&conf);
        std::fs::write(&path, text).unwrap();
        let cluster = Cluster { dir, port };
        cluster.start_again();
        cluster
    }

    fn data(&self) -> String {
        self.dir.join("data").display().to_string()
    }

    fn log(&self) -> String {
        self.dir.join("server.log").display().to_string()
    }

    /// Starts the server (after [`Cluster::stop`]).
    pub fn start_again(&self) {
        as_postgres(
            "pg_ctl",
            &[
                "-D",
                &self.data(),
                "-l",
                &self.log(),
                "-w",
                "-t",
                "60",
                "start",
            ],
        );
    }

    /// Stops the server: `fast` (a clean shutdown) or `immediate` (a crash).
    pub fn stop(&self, mode: &str) {
        as_postgres(
            "pg_ctl",
            &["-D", &self.data(), "-m", mode, "-w", "-t", "60", "stop"],
        );
    }

    /// libpq key=value connection string of a database of this server.
    pub fn conninfo(&self, db: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname={db}",
            self.port
        )
    }

    /// The same as a postgres:// URL, for the bridge.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    pub fn client(&self, db: &str) -> postgres::Client {
        postgres::Client::connect(&self.conninfo(db), postgres::NoTls).expect("connect")
    }

    /// A database with the extension.
    pub fn create_db(&self, db: &str) {
        self.client("postgres")
            .batch_execute(&format!("CREATE DATABASE \"{db}\""))
            .unwrap();
        self.client(db)
            .batch_execute("CREATE EXTENSION pg_envelopes")
            .unwrap();
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.dir.join("data/postmaster.pid").exists() {
            let _ = Command::new("runuser")
                .args(["-u", "postgres", "--", &format!("{}/pg_ctl", pg_bin())])
                .args(["-D", &self.data(), "-m", "immediate", "-w", "stop"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
