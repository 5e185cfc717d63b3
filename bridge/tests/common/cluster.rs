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

impl Cluster {
    /// A streaming standby of `primary` (a base backup with `-R`), in hot standby
    /// on a port of its own, connecting as `application_name` (the name
    /// `synchronous_standby_names` refers to), started.
    pub fn standby_of(primary: &Cluster, label: &str, application_name: &str) -> Cluster {
        let base = primary.dir.parent().unwrap().to_path_buf();
        let dir = base.join(unique(&format!("bt_{label}_")));
        std::fs::create_dir_all(&dir).unwrap();
        let _ = Command::new("chown")
            .args(["postgres:postgres", dir.to_str().unwrap()])
            .status();
        let data = dir.join("data");
        as_postgres(
            "pg_basebackup",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &primary.port.to_string(),
                "-U",
                "postgres",
                "-D",
                data.to_str().unwrap(),
                "-R",
                "-X",
                "stream",
                // At once: the default spread checkpoint takes minutes.
                "-c",
                "fast",
            ],
        );
        let port = free_port();
        // postgresql.auto.conf is read last: its primary_conninfo wins.
        let auto = data.join("postgresql.auto.conf");
        let mut text = std::fs::read_to_string(&auto).unwrap_or_default();
        text.push_str(&format!(
            "primary_conninfo = 'host=127.0.0.1 port={} user=postgres application_name={application_name}'\n",
            primary.port
        ));
        std::fs::write(&auto, text).unwrap();
        let conf = data.join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf).unwrap();
        text.push_str(&format!(
            "port = {port}\nunix_socket_directories = '{}'\nhot_standby = on\n",
            dir.display()
        ));
        std::fs::write(&conf, text).unwrap();
        let cluster = Cluster { dir, port };
        cluster.start_again();
        cluster
    }

    /// `pg_ctl promote`, waiting until the server accepts writes.
    pub fn promote(&self) {
        as_postgres("pg_ctl", &["-D", &self.data(), "-w", "-t", "60", "promote"]);
    }

    /// The postmaster's process id, from postmaster.pid.
    pub fn postmaster_pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.dir.join("data/postmaster.pid"))
            .ok()?
            .lines()
            .next()?
            .trim()
            .parse()
            .ok()
    }

    /// The server's processes: the postmaster and its children.
    pub fn pids(&self) -> Vec<u32> {
        let Some(postmaster) = self.postmaster_pid() else {
            return Vec::new();
        };
        let children = Command::new("ps")
            .args(["--ppid", &postmaster.to_string(), "-o", "pid="])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        std::iter::once(postmaster)
            .chain(children.split_whitespace().filter_map(|p| p.parse().ok()))
            .collect()
    }

    /// A crash of the whole machine, as far as the server can tell: SIGKILL to
    /// the postmaster and every one of its processes at once (no shutdown, no
    /// last WAL sent, every client connection cut).
    pub fn kill9(&self) {
        let pids: Vec<String> = self.pids().iter().map(u32::to_string).collect();
        if !pids.is_empty() {
            // Some may be gone already (children follow a dead postmaster).
            let _ = Command::new("kill")
                .arg("-KILL")
                .args(&pids)
                .stderr(Stdio::null())
                .status();
        }
        let _ = std::fs::remove_file(self.dir.join("data/postmaster.pid"));
    }

    /// The WAL receiver's process id (on a standby that streams).
    pub fn wal_receiver_pid(&self) -> Option<u32> {
        self.client("postgres")
            .query_opt("SELECT pid FROM pg_stat_wal_receiver", &[])
            .ok()
            .flatten()
            .and_then(|r| r.get::<_, Option<i32>>(0))
            .and_then(|p| u32::try_from(p).ok())
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
